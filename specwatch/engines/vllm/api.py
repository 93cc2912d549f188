"""What a vLLM server's HTTP API says about it: `/version` and `/v1/models`.

vLLM has no `/server_info` (only with `VLLM_SERVER_DEV_MODE=1`, and then without the settings
specwatch reads); `vllm/entrypoints/openai/api_server.py` (0.8.5.post1) and
`vllm/entrypoints/serve/` (0.33.0) answer `/version` with `{"version": "0.33.0"}` and
`/v1/models` with `{"object": "list", "data": [{"id": <served name>, "root": <model path>,
"max_model_len": N, …}]}`; `/health` is 200 while the engine runs (503 once it died, 0.12.0+).
`server_api.ServerApiSource` asks these when `/server_info` and `/get_server_info` answer 404.
"""

from __future__ import annotations

from specwatch.core.events import ServerInfo

VERSION_PATH = "/version"
MODELS_PATH = "/v1/models"


def is_vllm_server_info(doc: dict) -> bool:
    """A `/server_info` answer of vLLM's dev mode (`{"vllm_config": "…"}`), not SGLang's."""
    return "vllm_config" in doc and "internal_states" not in doc


def parse_vllm_info(version_doc: dict, models_doc: dict | None) -> ServerInfo:
    """`/version` and `/v1/models` answers → ServerInfo with args `engine` "vllm",
    `served_model_name`, `model_path`, `context_length` (the first model listed). Raises
    ValueError when `/version` has no version (not a vLLM server)."""
    version = version_doc.get("version")
    if not isinstance(version, str) or not version:
        raise ValueError("no version in /version")
    args: dict[str, object] = {"engine": "vllm"}
    data = (models_doc or {}).get("data")
    if isinstance(data, list) and data and isinstance(data[0], dict):
        m = data[0]
        for key, ours in (("id", "served_model_name"), ("root", "model_path"), ("max_model_len", "context_length")):
            if m.get(key) is not None:
                args[ours] = m[key]
    return ServerInfo(version=version, args=args, dp_states=(), endpoint=VERSION_PATH)
