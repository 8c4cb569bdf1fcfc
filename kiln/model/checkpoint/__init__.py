"""A checkpoint's files, read without torch: where the model is (``locate``), what it is
(``config``, and its rotary scaling, ``rope``), its tensors (``gguf_index``, ``gguf_tensors``,
``hf_tensors``) and a GGUF's tokenizer (``gguf_tokenizer``).

No module under this folder imports torch, triton or a ``kiln.model`` module outside it
(tests/test_import_boundaries.py): benchmarks and tests read a model's file without loading
torch, and start-up reads and tiles the files while torch imports."""
