"""Shared plumbing of the benchmarks in bench/.

- `db`: the throw-away database: create, drop, migrate and preload it (`preload.py`, run through
  `manage.py shell`), the app's environment pointing at it, and the clean-up at the end of a run.
- `stack`: the processes of the stack (gunicorn, `manage.py`), temporary folders, signals, the
  options every benchmark takes.
- `messages`: the signed RFC 5322 messages, made before the clock starts.
- `load`: HTTP load: forked Python client processes, or wrk (`wrk_post.lua`) when it is on PATH.
- `procstat`: readings from /proc: CPU per process group, memory, how busy the machine is.
- `profile`: optional py-spy profiles of chosen processes.
- `report`: the log line, percentiles and milliseconds.

Nothing here is imported by the application; the scripts in bench/ run as
`.venv/bin/python bench/<name>.py` from the repository root, which puts bench/ on sys.path and
makes this package importable as `lib`.
"""
