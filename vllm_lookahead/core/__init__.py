"""The lookahead algorithm, free of vLLM: parameters, candidate sources (Jacobi window, n-gram pools, prompt lookup,
suffix trees, token recycling), the step tree, verification, acceptance statistics, the tree sizing and its cost
model, and a reference decoder that checks them against a model of its own."""
