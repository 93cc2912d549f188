"""specwatch: watch speculative decoding (SGLang, EAGLE-3) and say why acceptance collapsed."""


def __getattr__(name: str):
    """`__version__`, read from the installed metadata on first use (importlib.metadata costs a
    start-up's worth of imports that `replay` does not need)."""
    if name != "__version__":
        raise AttributeError(f"module 'specwatch' has no attribute {name!r}")
    from importlib.metadata import PackageNotFoundError, version

    try:
        value = version("specwatch")
    except PackageNotFoundError:  # running from a source tree that was not installed
        value = "0.1.0"
    globals()["__version__"] = value
    return value
