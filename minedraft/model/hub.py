"""Checkpoints by local directory or by Hugging Face Hub id.

A name that is an existing directory is used as it is. Any other name is a Hub id
(`org/name`), resolved by `huggingface_hub` the way every Hugging Face tool does: its cache
(HF_HOME, HF_HUB_CACHE), a revision (branch, tag or commit), HF_TOKEN for gated or private
models, HF_HUB_OFFLINE to stay off the network. Only the files a checkpoint needs are fetched.

What cannot be had (offline or the Hub unreachable, and not cached; no such model or
revision) fails at once with a message naming the model, never after a long wait: offline
there is no network call at all, and online the Hub's own request timeout bounds the first.
No torch here, so the gateway can resolve its tokenizer with it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

# Config, generation config, tokenizer and weights; not *.bin / *.pt copies of the weights.
CHECKPOINT_FILES = ("*.json", "*.safetensors")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.*",
                   "generation_config.json", "config.json")
# Original (non-Hugging Face) weights that some repositories carry beside the converted ones.
_SKIPPED = ("original/*", "consolidated*")
_REPO_ID = re.compile(r"[A-Za-z0-9_][\w.-]*(/[A-Za-z0-9_][\w.-]*)?")


class CheckpointNotFound(FileNotFoundError):
    """A model that is neither a local directory nor to be had from the Hub or its cache."""


def resolve_checkpoint(name_or_path: str | Path, revision: str | None = None) -> Path:
    """-> the directory of a model checkpoint (config.json, *.safetensors, tokenizer): the
    argument itself when it is a directory, else the Hub model's snapshot in the local
    cache, downloaded first when it is missing and the Hub can be reached."""
    return _resolve(name_or_path, revision, CHECKPOINT_FILES, "config.json")


def resolve_tokenizer(name_or_path: str | Path, revision: str | None = None) -> Path:
    """-> a directory with the model's tokenizer.json; from the Hub only the tokenizer's files
    (and config.json) are fetched, not the weights."""
    return _resolve(name_or_path, revision, TOKENIZER_FILES, "tokenizer.json")


def _resolve(name_or_path: str | Path, revision: str | None, patterns: Sequence[str], needed: str) -> Path:
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        if revision:
            raise ValueError(f"revision {revision!r}: {name_or_path} is a local directory; "
                             "a revision applies only to a Hugging Face model id")
        return path
    name = str(name_or_path)
    if path.exists() or not _REPO_ID.fullmatch(name):
        raise CheckpointNotFound(f"{name}: no such model directory (nor is it a Hugging Face model id, org/name)")
    snapshot = Path(_snapshot(name, revision, patterns))
    if not (snapshot / needed).is_file():
        raise CheckpointNotFound(f"{_label(name, revision)}: the Hugging Face snapshot {snapshot} has no {needed}")
    return snapshot


def _label(name: str, revision: str | None) -> str:
    return f"{name} (revision {revision})" if revision else name


def _snapshot(name: str, revision: str | None, patterns: Sequence[str]) -> str:
    """The Hub's snapshot_download, its failures told as CheckpointNotFound."""
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import (GatedRepoError, HfHubHTTPError, HFValidationError, LocalEntryNotFoundError,
                                        RepositoryNotFoundError, RevisionNotFoundError)

    label = _label(name, revision)
    try:
        return snapshot_download(name, revision=revision, allow_patterns=list(patterns),
                                 ignore_patterns=list(_SKIPPED))
    except HFValidationError as err:
        raise CheckpointNotFound(f"{name}: no such model directory, nor a valid Hugging Face model id ({err})") from None
    except LocalEntryNotFoundError:
        cache = f"the Hugging Face cache ({constants.HF_HUB_CACHE})"
        if constants.HF_HUB_OFFLINE:
            raise CheckpointNotFound(
                f"{label}: not a local directory and not in {cache}, and HF_HUB_OFFLINE is set: download it "
                f"where there is network (`hf download {name}`) into this cache, or unset HF_HUB_OFFLINE") from None
        raise CheckpointNotFound(
            f"{label}: not a local directory and not in {cache}, and the Hugging Face Hub cannot be "
            f"reached (HF_ENDPOINT={constants.ENDPOINT}): check the network, or download it elsewhere "
            f"(`hf download {name}`) into this cache") from None
    except GatedRepoError:
        raise CheckpointNotFound(f"{label}: a gated model; accept its terms on the Hub and set HF_TOKEN") from None
    except RepositoryNotFoundError:
        raise CheckpointNotFound(f"{name}: no such model directory, nor a model on the Hugging Face Hub "
                                 "(a private one needs HF_TOKEN)") from None
    except RevisionNotFoundError:
        raise CheckpointNotFound(f"{name}: no revision {revision!r} on the Hugging Face Hub") from None
    except HfHubHTTPError as err:
        raise CheckpointNotFound(f"{label}: the Hugging Face Hub refused the download ({err})") from None
