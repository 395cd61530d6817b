"""Measuring a served model and sizing a deployment from the numbers: `infinity-cloud bench`
(a closed-loop load over HTTP, written as a profile) and `infinity-cloud plan`."""
