"""Run the server on this machine, or in a container built from the rendered files."""
