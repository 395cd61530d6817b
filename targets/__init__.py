"""Deployment targets: each renders files from templates/ and talks to one platform."""
