"""What a request must pass before any work is queued: the limits of a call (`validation`)
and the process's memory budget (`memory`)."""
