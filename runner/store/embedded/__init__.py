"""The embedded driver: the store on a gremlite (SQLite) file, one writer at a time, with SQL
written into gremlite's own tables where interpreting a traversal is too slow. What it relies
on in gremlite is named and checked at open in :mod:`runner.store.embedded.schema`."""
