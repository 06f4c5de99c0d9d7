"""PostgreSQL's advisory locks as tests read them.

pg_locks lists the locks of the whole server, and every pytest-xdist worker has a test database of its own:
a test that counts or ends lock holders reads only its own database's rows, or it sees another worker's.
"""

# A pg_locks condition: the row is a lock in the database this connection uses.
IN_THIS_DATABASE = "database = (SELECT oid FROM pg_database WHERE datname = current_database())"
