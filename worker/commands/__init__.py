"""The command line: `depositd` and every command."""
