"""Where the vLLM tests' model configs are (a module of its own: a test that imports
``conftest`` gets whichever conftest was imported first under that name)."""

from pathlib import Path

CONFIGS = Path(__file__).parent / "configs"
REPO = Path(__file__).resolve().parents[2]
POLICY_MODELS = REPO / "policies" / "models"
