"""The limits of the MIME walk (intake.mime's docstring says what each one does to a message past it): in a
module of their own so that every part of the parser reads them without importing the walk."""

MAX_DEPTH = 32
MAX_PARTS = 2000
MAX_BOUNDARY_LINES = 20_000  # lines starting with "--" beyond which only the headers are parsed
MAX_SIGNATURES = 20
MAX_ALTERNATIVES = 20
