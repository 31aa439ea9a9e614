"""The planner's settings records: validated, frozen pydantic models, each declared once here in the planner.

A record's fields carry their defaults and ranges. The config's `planner` section composes the
records whose fields a config sets (`libra.config.PlannerConfig` inherits them), so that section is
passed as it is where such a record is wanted; `of` takes a record's own fields out of it where a
record with further fields is wanted (set in code, never in a config: e.g. `PlannerSettings`).
"""

from __future__ import annotations

from typing import Self

from pydantic import BaseModel

from libra.validated import Validated


class Settings(Validated):

    @classmethod
    def of(cls, section: BaseModel) -> Self:
        """This record with the values `section` holds for its fields, and its defaults for the rest."""
        return cls.model_validate(section.model_dump(include=set(cls.model_fields)))
