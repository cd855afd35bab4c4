"""The problem reader, split by family of fields: :mod:`.document` reads a file's YAML and holds
the rules between families; :mod:`.fields` the top-level names; :mod:`.scalars`, :mod:`.matrices`,
:mod:`.layer` (Q, K, V or X with the heads' weights), :mod:`.masks`, :mod:`.positions`,
:mod:`.passes` (backward, tiling, decode) and :mod:`.rope` each read their own."""
