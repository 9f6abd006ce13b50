"""The limits of the ``.pt2`` checks and the archive layout ``torch.export.save`` writes in
PyTorch 2.13 (constants only; :mod:`compiler.frontends.pt2_safety` says what each check does)."""

from __future__ import annotations

DEFAULT_MAX_UNCOMPRESSED_BYTES = 4 * 1024**3
DEFAULT_MAX_MEMBERS = 20_000
#: Programs one archive may hold (a decoder's prefill, decode and step, and a few buckets of
#: them): each is loaded, imported, tuned and verified, so their number bounds all that work.
DEFAULT_MAX_PROGRAMS = 8
#: a member larger than this whose compression ratio exceeds MAX_COMPRESSION_RATIO is a zip bomb
#: (torch.export.save stores members uncompressed, so genuine archives have ratio 1).
ZIP_BOMB_MIN_BYTES = 1024 * 1024
MAX_COMPRESSION_RATIO = 200
MAX_EXPRESSION_CHARS = 20_000

# Layout constants of torch/csrc/export/pt2_archive_constants.h (tests check them against torch).
ARCHIVE_FORMAT_PATH = "archive_format"
ARCHIVE_FORMAT_VALUE = "pt2"
ARCHIVE_VERSION_PATH = "archive_version"
MODELS_DIR = "models/"
WEIGHTS_DIR = "data/weights/"
CONSTANTS_DIR = "data/constants/"
SAMPLE_INPUTS_DIR = "data/sample_inputs/"
AOTINDUCTOR_DIR = "data/aotinductor/"
EXECUTORCH_DIR = "data/executorch/"
TENSOR_CONSTANT_FILENAME_PREFIX = "tensor_"
CUSTOM_OBJ_FILENAME_PREFIX = "custom_obj_"
OPAQUE_OBJ_FILENAME_PREFIX = "opaque_obj_"
