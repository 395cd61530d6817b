"""The Modal client, imported on first use: its credentials checked before anything is built,
and every call's failure one clear line. The deployment (`target`) and the bulk job (`job`)
both call Modal through here."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType

from infinity_cloud.core.errors import InfinityCloudError
from infinity_cloud.core.install_hint import install_command
from infinity_cloud.targets.base import TargetError
from infinity_cloud.targets.modal.spec import ModalSpec

# The class of the app's job app (`job_app`) that `embed --runner modal` maps shards over.
JOB_CLASS = "ShardEmbedder"
# The longest one shard may take in a job's container: a thousand long texts on a CPU take
# minutes; more means the container is stuck, and the shard is retried (Modal's retries).
SHARD_TIMEOUT_S = 1800
SHARD_RETRIES = 2


class ModalError(TargetError):
    """Modal is missing, not logged in, refused a call, or did not answer."""


NO_CREDENTIALS = (
    "no Modal credentials: run `modal token new` (it writes ~/.modal.toml), or set "
    "MODAL_TOKEN_ID and MODAL_TOKEN_SECRET (from https://modal.com/settings/tokens), then run this again"
)
REJECTED_CREDENTIALS = (
    "Modal rejected this machine's token: run `modal token new` (or set MODAL_TOKEN_ID and "
    "MODAL_TOKEN_SECRET to a valid token from https://modal.com/settings/tokens), then run this again"
)


def import_modal() -> ModuleType:
    try:
        import modal
    except ImportError:
        raise ModalError(f"the Modal client is not installed: {install_command('modal')}") from None
    return modal


def require_credentials() -> None:
    """Refuse early, before building anything, when the Modal client has no token to send."""
    config = import_modal().config.config
    if not (config.get("token_id") and config.get("token_secret")):
        raise ModalError(NO_CREDENTIALS)


@contextmanager
def modal_calls(action: str, spec: ModalSpec, missing: str | None = None) -> Iterator[None]:
    """Every call to Modal ends in one clear line: a rejected token, an unknown app (or what
    `missing` says Modal may not have found), Modal's refusal, or anything else that went
    wrong on the way (network, a client bug)."""
    modal = import_modal()
    try:
        yield
    except modal.exception.AuthError:
        raise ModalError(REJECTED_CREDENTIALS) from None
    except modal.exception.NotFoundError as exc:
        if missing is not None:
            raise ModalError(f"{missing}: {exc}") from None
        where = f" in environment {spec.environment!r}" if spec.environment else ""
        raise ModalError(f"no Modal app named {spec.app_name!r}{where}") from None
    except modal.exception.Error as exc:
        raise ModalError(f"Modal refused to {action}: {exc}") from exc
    except (InfinityCloudError, KeyboardInterrupt):  # ours already say what went wrong
        raise
    except Exception as exc:
        raise ModalError(f"could not {action}: {type(exc).__name__}: {exc}") from exc
