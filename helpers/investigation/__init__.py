"""The investigation: a loaded pair, layouts scored and ranked, the one verdict and the ways out,
trainers' dumps, and a deployment's acceptance metrics."""
