"""The reader's part for matrices: written as lists of rows (the plain numbers' fast paths
first), or read from a .npy, .csv or .safetensors file in the problem's folder, every number
counted against the size limit."""

from __future__ import annotations

import itertools
import os
from pathlib import Path

import yaml
from sympy import QQ

from .. import located_yaml as _yaml
from ...reading import FileError, read_regular
from ...numbers.matrices import rational_matrix
from ...text import did_you_mean, quote_path
from ..budget import BYTES_PER_NUMBER
from ..checkpoints import safetensors as _safetensors
from ..located_yaml import Where
from ..model import Matrix
from ..places import entry_field, row_field
from ..plain_numbers import flow_rational_matrix, plain_rational_matrix
from ..tables import float_matrix, np_isfinite, np_largest, read_csv, read_npy


class MatrixFields:
    """Matrices, from the YAML text or from files."""

    def rows_of(self, node: yaml.Node, name: str) -> list[list[yaml.Node]]:
        """The entry nodes of a matrix written as a list of rows."""
        if not isinstance(node, yaml.SequenceNode):
            raise self.at(node).error(
                f"a matrix is a list of rows such as [[1, 0], [0, 1]], not {_yaml.kind(node)}", name
            )
        if not node.value:
            raise self.at(node).error("the matrix is empty; it needs at least one row", name)
        if len(node.value) > self.max_size:
            raise self.at(node).error(f"the matrix has more than {self.max_size:,} rows (the size limit; raise it with --max-size)", name)
        rows = []
        width = None
        for i, row in enumerate(node.value):
            if not isinstance(row, yaml.SequenceNode):
                hint = " (a single row is written [[...]])" if isinstance(row, yaml.ScalarNode) else ""
                raise self.at(row).error(f"row {i + 1} must be a list of numbers, not {_yaml.kind(row)}{hint}", row_field(name, i))
            if not row.value:
                raise self.at(row).error("the row is empty", row_field(name, i))
            if len(row.value) > self.max_size:
                raise self.at(row).error(
                    f"the row has more than {self.max_size:,} entries (the size limit; raise it with --max-size)",
                    row_field(name, i),
                )
            if width is None:
                width = len(row.value)
            elif len(row.value) != width:
                raise self.at(row).error(
                    f"row {i + 1} has {len(row.value)} entries but row 1 has {width}; every row needs the same length",
                    row_field(name, i),
                )
            rows.append(row.value)
        self.count(len(rows) * width, self.at(node), name)
        return rows

    def count(self, numbers: int, where_: Where, name: str) -> None:
        """Add a matrix's numbers to the problem's total and enforce the size limit."""
        self.size += numbers
        if self.size > self.max_size:
            raise where_.error(
                f"the problem holds more than {self.max_size:,} numbers (the size limit); "
                "if it is meant to be this large, raise the limit with --max-size",
                name,
            )

    def matrix(self, node: yaml.Node, name: str, allow_neg_inf: bool = False, vector: bool = False) -> Matrix:
        if isinstance(node, yaml.MappingNode):
            return self.matrix_file(node, name, vector)
        if isinstance(node, _yaml.FlowMatrix):
            fast = self.flow_matrix(node, name)
            if fast is not None:
                return fast
        rows = self.rows_of(node, name)
        fast = plain_rational_matrix(rows)
        if fast is not None:
            return fast
        return Matrix(
            [
                [self.number(entry, entry_field(name, i, j), allow_neg_inf) for j, entry in enumerate(row)]
                for i, row in enumerate(rows)
            ]
        )

    def flow_matrix(self, node: _yaml.FlowMatrix, name: str) -> Matrix | None:
        """A matrix of plain numbers read straight from its text; None leaves anything
        to report (a ragged row, the size limit) to the usual path."""
        numbers = sum(map(str.count, node.rows, itertools.repeat(","))) + len(node.rows)
        if self.size + numbers > self.max_size:
            # Beyond the size limit: refused from the text, with the message composing would give,
            # before anything is composed (a 30 MB row would take minutes).
            if len(node.rows) > self.max_size:
                raise self.at(node).error(
                    f"the matrix has more than {self.max_size:,} rows (the size limit; raise it with --max-size)", name)
            width = node.rows[0].count(",") + 1
            for i, row in enumerate(node.rows):
                n = row.count(",") + 1
                if n > self.max_size:
                    raise node.row_where(self.file, i).error(
                        f"the row has more than {self.max_size:,} entries (the size limit; raise it with --max-size)",
                        row_field(name, i),
                    )
                if n != width:
                    raise node.row_where(self.file, i).error(
                        f"row {i + 1} has {n} entries but row 1 has {width}; every row needs the same length",
                        row_field(name, i),
                    )
            self.count(numbers, self.at(node), name)
        m = flow_rational_matrix(node.rows, checked=True)  # _yaml matched each row as it cut the matrix out
        if m is not None:
            self.count(numbers, self.at(node), name)
        return m

    def matrix_file(self, node: yaml.MappingNode, name: str, vector: bool = False,
                    first_rows: int | None = None) -> Matrix:
        keys = {k.value: (k, v) for k, v in node.value if isinstance(k, yaml.ScalarNode)}
        if "file" not in keys or len(keys) != len(node.value):
            raise self.at(node).error("a matrix is a list of rows, or {file: NAME} naming a .npy, .csv "
                                      "or .safetensors file", name)
        path, rel, where_ = self.resolve_file(keys["file"][1], name)
        suffix = path.suffix.lower()
        refusal = _safetensors.pickle_refusal(rel)
        if refusal:
            raise where_.error(refusal, name)
        if suffix == ".safetensors":
            return self.checkpoint_matrix(keys, path, rel, where_, name, vector, first_rows)
        extra = sorted(set(keys) - {"file"})
        if extra:
            raise self.at(keys[extra[0]][0]).error(
                f"{extra[0]}: is for a tensor of a .safetensors file; a .npy or .csv file is read whole", name)
        if suffix not in (".csv", ".npy"):
            raise where_.error(f"{quote_path(rel)}: a matrix file must end in .npy, .csv or .safetensors", name)
        try:
            data = read_regular(path, BYTES_PER_NUMBER * self.max_size,
                                f"{quote_path(rel)} is {{size}} bytes, beyond the size limit; raise it with --max-size",
                                noun="matrix file")
        except FileError as exc:
            if str(exc).startswith(repr(rel)):
                raise where_.error(str(exc), name) from None
            if str(exc).startswith("is "):  # a folder, a FIFO, a device, a socket
                raise where_.error(f"{quote_path(rel)} {exc}", name) from None
            how = " as a .npy file" if suffix == ".npy" else ""
            raise where_.error(f"cannot read {quote_path(rel)}{how}: {exc.strerror}", name) from None
        m = read_csv(data, rel, where_, name) if suffix == ".csv" else \
            read_npy(data, rel, where_, name, self.max_size - self.size, vector)
        self.count(m.rows * m.cols, where_, name)
        return m

    def resolve_file(self, value: yaml.Node, name: str) -> tuple[Path, str, Where]:
        """The path of the file ``value`` names, inside the problem's folder, with its name as
        written and its place."""
        if not isinstance(value, yaml.ScalarNode) or _yaml.is_null(value):
            raise self.at(value).error("file: needs a file name", name)
        where_ = self.at(value)
        rel = value.value
        if self.base_dir is None:
            raise where_.error("matrices from files need the problem to be read from a file", name)
        if "\x00" in rel:
            raise where_.error(f"{quote_path(rel)}: the file name holds a NUL byte; no file is named so", name)
        if os.path.isabs(rel) or ".." in Path(rel).parts:
            raise where_.error(f"{quote_path(rel)} must be a path inside the problem's folder (no absolute paths, no ..)", name)
        try:
            path = (self.base_dir / rel).resolve()
        except (RuntimeError, OSError):  # Python before 3.13 raises RuntimeError for a loop of links
            raise where_.error(f"cannot read {quote_path(rel)}: the path is a loop of symbolic links; it leads to no file",
                               name) from None
        if self.base_dir not in path.parents:
            raise where_.error(f"{quote_path(rel)} leaves the problem's folder", name)
        return path, rel, where_

    def checkpoint_matrix(self, keys: dict, path: Path, rel: str, where_: Where, name: str, vector: bool = False,
                          first_rows: int | None = None) -> Matrix:
        """``{file: X.safetensors, tensor: NAME, rows: "a:b", cols: "c:d", transpose: true}``:
        a slice of one tensor, read lazily, each float its exact dyadic rational; or
        ``{file: X.safetensors, embeddings: TABLE, tokens: [ids]}``: rows of an embedding table.
        ``first_rows``: with no ``rows:``, the table's first rows (learned positions)."""
        if "embeddings" in keys:
            from ..checkpoints.embeddings import embedding_rows

            array = embedding_rows(self, keys, path, rel, where_, name)
            return self.checkpoint_array(array, keys["embeddings"][1], rel, where_, name)
        for k in keys:
            if k not in ("file", "tensor", "rows", "cols", "transpose"):
                raise self.at(keys[k][0]).error(
                    f"{k}: unknown key{did_you_mean(k, ('tensor', 'rows', 'cols', 'transpose', 'embeddings'), ignore_case=True)}; "
                    "a tensor of a .safetensors file takes file, tensor, rows, cols and transpose "
                    "(or file, embeddings, tokens and cols for rows of an embedding table)", name)
        if "tensor" not in keys:
            raise where_.error(f"{quote_path(rel)}: a .safetensors file holds many tensors; name one with tensor:", name)
        texts = {}
        for k in ("tensor", "rows", "cols"):
            if k in keys:
                v = keys[k][1]
                if not isinstance(v, yaml.ScalarNode) or _yaml.is_null(v) or not v.value.strip():
                    raise self.at(v).error(f"{k}: needs " + ("a tensor name" if k == "tensor" else
                                                              'a slice like "0:64" (quote it)'), name)
                texts[k] = v.value
        transpose = False
        if "transpose" in keys:
            v = keys["transpose"][1]
            if not (isinstance(v, yaml.ScalarNode) and v.value in ("true", "false", "True", "False")):
                raise self.at(v).error("transpose: is true or false", name)
            transpose = v.value.lower() == "true"
        try:
            array = _safetensors.read_slice(path, rel, texts["tensor"], texts.get("rows"), texts.get("cols"),
                                            self.max_size - self.size, vector, first_rows)
        except _safetensors.CheckpointError as exc:
            text = str(exc)
            field = next((k for k in ("rows", "cols") if text.startswith(k + ":")), None)
            if field is not None:
                raise self.at(keys[field][1]).error(text, name) from None
            if text.startswith("has no tensor") or text.startswith("tensor "):
                raise self.at(keys["tensor"][1]).error(f"{quote_path(rel)} {text}" if text.startswith("has") else text,
                                                       name) from None
            raise where_.error(f"{quote_path(rel)} {text}" if not text.startswith("the slice") else text, name) from None
        if transpose:
            array = array.T
        return self.checkpoint_array(array, keys["tensor"][1], rel, where_, name)

    def read_table(self, path: Path, rel: str, tensor: str, where_: Where, name: str = "logits.tied") -> Matrix:
        """The whole of the embedding table ``tensor`` (a tied unembedding), counted against the size limit."""
        try:
            array = _safetensors.read_slice(path, rel, tensor, None, None, self.max_size - self.size)
        except _safetensors.CheckpointError as exc:
            raise where_.error(f"{quote_path(rel)} {exc}", name) from None
        m = self.slice_matrix(array, rel, where_, name)
        self.count(m.rows * m.cols, where_, name)
        return m

    def checkpoint_array(self, array, at: yaml.Node, rel: str, where_: Where, name: str) -> Matrix:
        """The exact matrix of an array read from a checkpoint (``at``: where to report its values),
        counted against the size limit."""
        m = self.slice_matrix(array, rel, self.at(at), name)
        self.count(m.rows * m.cols, where_, name)
        return m

    def slice_matrix(self, array, rel: str, where_: Where, name: str) -> Matrix:
        """The exact matrix of a slice read from a checkpoint: integers, or each float the dyadic
        rational it stands for."""
        if array.dtype.kind in "iu":
            return rational_matrix(array.shape[0], array.shape[1], [QQ(int(v)) for v in array.ravel().tolist()])
        if not np_isfinite(array):
            raise where_.error(f"{quote_path(rel)}: the slice holds NaN or infinite values", name)
        if np_largest(array) > 1e300:
            raise where_.error(f"{quote_path(rel)}: the slice holds a value larger than 10^300 in size; use smaller numbers", name)
        return float_matrix(array)

