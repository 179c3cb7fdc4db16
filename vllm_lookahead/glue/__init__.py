"""The vLLM glue: the engine one model runner drives (request states, the step object, drafting, verification,
sampling), which requests lookahead serves, which backend runs their attention, and `patches/`, every replacement
of vLLM code."""
