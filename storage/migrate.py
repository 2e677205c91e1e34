"""Bring an older study database up to the current tables: columns added since it was written are added (NULL in
the old rows), and what an old row said only in words is moved into its column.

Only additions: a column is never dropped or changed, so an older ``tuner`` still reads the database.
"""

from __future__ import annotations

import logging
import re

from sqlalchemy import Engine, inspect, text

from storage.models import Base

_logger = logging.getLogger(__name__)

_OLD_REPEAT = re.compile(r"same configuration as trial (\d+): not run again")
"""How a repeated trial was marked before ``repeat_of`` existed (in its reason)."""


def missing_columns(engine: Engine) -> list[tuple[str, str]]:
    """``(table, column)`` for every column of the current tables that an existing table lacks."""
    insp = inspect(engine)
    out = []
    for table in Base.metadata.sorted_tables:
        if not insp.has_table(table.name):
            continue
        have = {c["name"] for c in insp.get_columns(table.name)}
        out += [(table.name, c.name) for c in table.columns if c.name not in have]
    return out


def upgrade(engine: Engine) -> list[str]:
    """Add the missing columns (and fill ``repeat_of`` from old reasons); returns ``table.column`` per column."""
    added = []
    for table_name, col_name in missing_columns(engine):
        col = Base.metadata.tables[table_name].columns[col_name]
        ddl = f"ALTER TABLE {table_name} ADD COLUMN {col_name} {col.type.compile(engine.dialect)}"
        with engine.begin() as conn:
            conn.execute(text(ddl))
        added.append(f"{table_name}.{col_name}")
        _logger.info("storage: added column %s.%s", table_name, col_name)
    if "tuner_trials.repeat_of" in added:
        with engine.begin() as conn:
            rows = conn.execute(
                text("SELECT id, reason FROM tuner_trials WHERE reason LIKE :p"), {"p": "%not run again%"}
            ).all()
            for row_id, reason in rows:
                m = _OLD_REPEAT.search(reason or "")
                if m:
                    conn.execute(
                        text("UPDATE tuner_trials SET repeat_of = :n WHERE id = :i"),
                        {"n": int(m.group(1)), "i": row_id},
                    )
    return added
