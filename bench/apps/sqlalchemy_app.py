"""The SQLAlchemy application beside smoosh: SQLAlchemy 2.x at its defaults, one engine per tenant.

Runs in ``.venv-apps`` (``python -m bench.apps.sqlalchemy_app``; see
:func:`bench.apps.workload.main` for the commands). Each tenant has its engine from
``create_engine("sqlite:///PATH")`` and nothing else: the pysqlite driver, its default pool,
Python's ``sqlite3`` default busy timeout (5 s) and the driver's own transaction handling
(which sends ``BEGIN`` before the first write, not before a read). Every unit of work has a
``Session`` of its own (``with Session(engine) as session``), reads, then writes and commits;
the table is created by ``metadata.create_all``.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Sequence

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from sqlalchemy import Integer, String, Text, create_engine, delete, select, update  # noqa: E402
from sqlalchemy.exc import DBAPIError  # noqa: E402
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column  # noqa: E402

from bench.apps.workload import App, main  # noqa: E402

#: The table of the model.
TABLE = "items"


class Base(DeclarativeBase):
    pass


class Item(Base):
    """A row of the workload: a unique key, a counter it increments, a text payload it rewrites."""

    __tablename__ = TABLE
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    key: Mapped[str] = mapped_column(String(64), unique=True)
    counter: Mapped[int] = mapped_column(Integer, default=0)
    payload: Mapped[str] = mapped_column(Text)


class SqlAlchemyApp(App):
    """The workload's operations through SQLAlchemy's ORM (see the module docstring)."""

    db_errors = (DBAPIError,)

    def __init__(self, paths: Sequence[str]) -> None:
        self._engines = [create_engine(f"sqlite:///{path}") for path in paths]

    def ids(self, tenant: int) -> list[int]:
        with Session(self._engines[tenant]) as session:
            return list(session.scalars(select(Item.id)))

    def create(self, tenant: int, key: str, payload: str) -> int:
        with Session(self._engines[tenant]) as session:
            item = Item(key=key, counter=0, payload=payload)
            session.add(item)
            session.commit()
            return int(item.id)

    def get_or_create(self, tenant: int, key: str, payload: str) -> tuple[int, bool]:
        with Session(self._engines[tenant]) as session:
            item = session.scalars(select(Item).where(Item.key == key)).first()
            if item is not None:
                return int(item.id), False
            item = Item(key=key, counter=0, payload=payload)
            session.add(item)
            session.commit()
            return int(item.id), True

    def read_modify_write(self, tenant: int, row_id: int, payload: str) -> tuple[str, int] | None:
        with Session(self._engines[tenant]) as session:
            item = session.get(Item, row_id)
            if item is None:
                return None
            item.counter += 1
            item.payload = payload
            key, counter = str(item.key), int(item.counter)
            session.commit()
            return key, counter

    def f_update(self, tenant: int, row_id: int) -> int:
        with Session(self._engines[tenant]) as session:
            result = session.execute(update(Item).where(Item.id == row_id).values(counter=Item.counter + 1))
            session.commit()
            return int(result.rowcount)

    def bulk_delete(self, tenant: int, row_ids: Sequence[int]) -> int:
        with Session(self._engines[tenant]) as session:
            result = session.execute(delete(Item).where(Item.id.in_(list(row_ids))))
            session.commit()
            return int(result.rowcount)

    def read(self, tenant: int, row_ids: Sequence[int]) -> int:
        with Session(self._engines[tenant]) as session:
            return len(list(session.scalars(select(Item).where(Item.id.in_(list(row_ids))))))


def schema(path: str) -> dict[str, Any]:
    """Create the model's table in the empty database ``path`` with ``metadata.create_all``."""
    engine = create_engine(f"sqlite:///{path}")
    Base.metadata.create_all(engine)
    engine.dispose()
    return {"table": TABLE}


def versions() -> dict[str, str]:
    import sqlite3

    import sqlalchemy

    return {"sqlalchemy": sqlalchemy.__version__, "python": sys.version.split()[0], "sqlite": sqlite3.sqlite_version}


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:], SqlAlchemyApp, schema, versions))
