"""The lookahead algorithm, free of vLLM: parameters, candidate sources (Jacobi window, n-gram pools, prompt lookup,
suffix trees, token recycling), the step tree, verification, acceptance statistics, the tree sizing and its cost
model. (The reference decoder that checks them on a model of its own is development tooling: `devtools`.)"""
