"""The store: schema, migrations, the group-commit writer and every SQL statement."""
