"""Route handlers: short, no try/except; errors reach the one table in server/errors.py."""
