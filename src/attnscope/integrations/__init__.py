"""Adapters to other libraries' interfaces; each imports its library only when it is imported itself.

- `attnscope.integrations.transformers`: ``register()`` makes ``attn_implementation="attnscope"`` available
  to Hugging Face transformers models (``pip install 'attnscope[transformers]'``).
"""
