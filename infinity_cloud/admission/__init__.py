"""What a request must pass before any work is queued, and what stops work it no longer
needs: the limits of a call (`validation`), the process's memory budget (`memory`), and
cancellation when a caller goes away (`cancellation`)."""
