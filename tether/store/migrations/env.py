"""Alembic environment: migrations run on the connection the store hands over."""

from alembic import context

from tether.store._tables import add_partial_indexes, metadata

add_partial_indexes()

connection = context.config.attributes["connection"]
context.configure(
    connection=connection,
    target_metadata=metadata,
    render_as_batch=connection.dialect.name == "sqlite",
)
with context.begin_transaction():
    context.run_migrations()
