"""The model as the C kernels run it, without torch: ``c_model`` (a GGUF the CPU step runs
whole, ``CModel``), ``step_weights`` (the C step's weight table, the one layout of it),
``early_tiles`` (start-up tiling the matrices on a thread while the server imports) and
``plan`` (which implementation runs each part of a step: C, Triton or torch).

No module under this folder imports torch, triton or a ``kiln.model`` module outside it and
``kiln/model/checkpoint/``, whose files it reads (tests/test_import_boundaries.py); the torch
side (``kiln/model/``) imports from here, never the other way round."""
