"""Django's own date and time display in the console's one format: "2026-12-01 08:51 UTC".

Read for LANGUAGE_CODE "en-us" (FORMAT_MODULE_PATH = "config.formats"): list columns, read-only fields,
change history and the `date` filter of every admin page then agree with `reconciliation.times`.
Input formats are not set here: Django's English ones still apply.
"""

DATETIME_FORMAT = "Y-m-d H:i T"
SHORT_DATETIME_FORMAT = "Y-m-d H:i T"
DATE_FORMAT = "Y-m-d"
SHORT_DATE_FORMAT = "Y-m-d"
TIME_FORMAT = "H:i"
MONTH_DAY_FORMAT = "F j"
YEAR_MONTH_FORMAT = "F Y"
