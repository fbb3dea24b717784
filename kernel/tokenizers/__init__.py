"""Public tokenizers for text datasets: the built-in byte tokenizer, uploaded Hugging Face
``tokenizer.json`` files, and BPE tokenizers trained on public text (torch-free)."""

from kernel.tokenizers.base import BYTE_TOKENIZER_ID, TextTokenizer
from kernel.tokenizers.byte import ByteTokenizer

__all__ = ["BYTE_TOKENIZER_ID", "ByteTokenizer", "TextTokenizer"]
