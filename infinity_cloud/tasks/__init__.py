"""The maths of each capability, written once as pure functions over numpy arrays."""
