"""specwatch: watch speculative decoding (SGLang, EAGLE-3) and say why acceptance collapsed."""

from importlib.metadata import PackageNotFoundError, version as _version

try:
    __version__ = _version("specwatch")
except PackageNotFoundError:  # running from a source tree that was not installed
    __version__ = "0.1.0"
