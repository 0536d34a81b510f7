"""What versions a repository holds and what they are called: `refs` (model names -> head
versions, on disk), `refspec` (parsing `NAME@N`, `NAME@HEX`), and `catalog` (the SQLite index
of versions, objects, edges and sketches, rebuilt from the store when lost; `rows`, what it
gives back).
"""
