"""Rule families of the diagnosis engine, one module each; `engine.RULES` orders them."""
