"""Public pretrained weights a tenant uploads for one zoo architecture (docs/pretraining-and-finetuning.md).

``safetensors_header`` reads a file's tensor table without torch, ``expected`` asks a capped child
process which tensors the architecture has, ``dtypes`` says which stored dtypes fit (any floating
one for a floating parameter), ``registry`` validates, stores by content hash and answers
list/show/delete.
"""
