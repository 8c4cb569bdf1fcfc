"""Generated from contract/ by `python -m codegen`. Never edit these files."""
