"""Peers that `litekiln bench` times beside litekiln (LiteRT's are in litekiln.bench itself).

``torch_recipe`` rebuilds a corpus model's PyTorch module (standard library only at import:
scripts/corpus_torch.py imports it in the corpus virtualenv); ``torch_peer`` times it in eager
mode, with a CUDA graph and through torch.compile (``litekiln bench --peer torch``).
"""
