"""The admin dashboard's templates, queries and server-rendered SVG charts."""
