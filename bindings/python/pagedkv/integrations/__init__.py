"""Integrations of pagedkv with model libraries.

``pagedkv.integrations.transformers``: Hugging Face transformers decoder
models with their attention routed through pagedkv, and a continuous-batching
generator around them. Each integration imports its library lazily: importing
``pagedkv`` never needs torch or transformers.
"""
