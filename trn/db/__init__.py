"""Landmark database (FAISS, cosine) and instance tokens for late-interaction re-ranking."""

from trn.db.database import DBConfig, Decision, LandmarkDB
from trn.db.tokens import TokenConfig

__all__ = ["DBConfig", "Decision", "LandmarkDB", "TokenConfig"]
