"""Spark DDL struct strings read in Python, for the keyed tester, which runs without a JVM.

A processor declares its ``output_schema`` and ``state_schema`` as Spark DDL
(``"user string, orders long"``). PySpark hands such a string to the JVM to parse it
(``StructType.fromDDL`` needs a running session), so :class:`~trilink_spark.testing.KeyedTester`
reads it here instead, into the same ``pyspark.sql.types`` objects: column names as written
(backquoted ones with doubled backticks), ``name type`` or ``name: type``, ``NOT NULL``,
``COMMENT '...'``, and the types Spark's parser names: ``boolean``, ``tinyint``/``byte``,
``smallint``/``short``, ``int``/``integer``, ``bigint``/``long``, ``float``/``real``,
``double``, ``decimal``/``dec``/``numeric`` with an optional ``(precision[, scale])``,
``string``, ``char(n)``, ``varchar(n)``, ``binary``, ``date``, ``timestamp``,
``timestamp_ltz``, ``timestamp_ntz``, ``void``, and ``array<...>``, ``map<..., ...>``,
``struct<...>`` of them, in any case. Interval, variant and collated string types are refused.
The tests check it against Spark's own parser.

Examples
--------
>>> struct_of("user string, `n.b` long NOT NULL, m map<string, array<decimal(5, 2)>>")
... # doctest: +NORMALIZE_WHITESPACE
StructType([StructField('user', StringType(), True), StructField('n.b', LongType(), False),
            StructField('m', MapType(StringType(), ArrayType(DecimalType(5,2), True), True),
                        True)])
"""

from __future__ import annotations

import re
from typing import Any, NoReturn

from ..errors import InvalidArgumentError, InvalidArgumentTypeError

__all__ = ["struct_of"]

_TOKEN = re.compile(r"\s*(?:(`(?:[^`]|``)*`)|('(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\")"
                    r"|([A-Za-z0-9_]+)|([<>(),:]))")


def _atomic(name: str) -> Any:
    """The Spark type of an atomic type name (lower case), or None."""
    from pyspark.sql import types as T

    return {
        "boolean": T.BooleanType, "tinyint": T.ByteType, "byte": T.ByteType,
        "smallint": T.ShortType, "short": T.ShortType, "int": T.IntegerType,
        "integer": T.IntegerType, "bigint": T.LongType, "long": T.LongType,
        "float": T.FloatType, "real": T.FloatType, "double": T.DoubleType,
        "string": T.StringType, "binary": T.BinaryType, "date": T.DateType,
        "timestamp": T.TimestampType, "timestamp_ltz": T.TimestampType,
        "timestamp_ntz": T.TimestampNTZType, "void": T.NullType,
    }.get(name)


class _Parser:
    """A recursive-descent reader of one DDL string (O(len(text)))."""

    def __init__(self, text: str, what: str) -> None:
        self.text = text
        self.what = what
        self.tokens: list[tuple[str, str]] = []  # (kind, text): name, quoted, string, punct
        at = 0
        while at < len(text):
            if text[at:].strip() == "":
                break
            found = _TOKEN.match(text, at)
            if found is None:
                self.fail(f"unexpected {text[at:].strip()[:20]!r}")
            quoted, string, word, punct = found.groups()
            if quoted is not None:
                self.tokens.append(("quoted", quoted[1:-1].replace("``", "`")))
            elif string is not None:
                self.tokens.append(("string", string))
            elif word is not None:
                self.tokens.append(("name", word))
            else:
                self.tokens.append(("punct", punct))
            at = found.end()
        self.at = 0

    def fail(self, why: str) -> NoReturn:
        raise InvalidArgumentError(f"{self.what} {self.text!r} is not a Spark DDL struct ({why})")

    def peek(self, offset: int = 0) -> tuple[str, str]:
        i = self.at + offset
        return self.tokens[i] if i < len(self.tokens) else ("end", "")

    def take(self) -> tuple[str, str]:
        token = self.peek()
        if token[0] == "end":
            self.fail("it ends too soon")
        self.at += 1
        return token

    def expect(self, punct: str) -> None:
        kind, text = self.take()
        if kind != "punct" or text != punct:
            self.fail(f"expected {punct!r}, got {text!r}")

    def word(self, *words: str) -> bool:
        """Take the next token if it is one of ``words`` (any case)."""
        kind, text = self.peek()
        if kind == "name" and text.lower() in words:
            self.at += 1
            return True
        return False

    def number(self) -> int:
        kind, text = self.take()
        if kind != "name" or not text.isdigit():
            self.fail(f"expected a number, got {text!r}")
        return int(text)

    def data_type(self) -> Any:
        from pyspark.sql import types as T

        kind, text = self.take()
        if kind != "name":
            self.fail(f"expected a type, got {text!r}")
        name = text.lower()
        if name == "array":
            self.expect("<")
            element = self.data_type()
            self.expect(">")
            return T.ArrayType(element, True)
        if name == "map":
            self.expect("<")
            key = self.data_type()
            self.expect(",")
            value = self.data_type()
            self.expect(">")
            return T.MapType(key, value, True)
        if name == "struct":
            self.expect("<")
            fields = [] if self.peek() == ("punct", ">") else self.fields(">")
            self.expect(">")
            return T.StructType(fields)
        if name in ("decimal", "dec", "numeric"):
            precision, scale = 10, 0
            if self.peek() == ("punct", "("):
                self.take()
                precision = self.number()
                if self.peek() == ("punct", ","):
                    self.take()
                    scale = self.number()
                self.expect(")")
            if not 1 <= precision <= 38 or scale > precision:
                self.fail(f"decimal({precision}, {scale}) is beyond Spark's decimals")
            return T.DecimalType(precision, scale)
        if name in ("char", "character", "varchar"):
            self.expect("(")
            length = self.number()
            self.expect(")")
            return T.VarcharType(length) if name == "varchar" else T.CharType(length)
        atomic = _atomic(name)
        if atomic is None:
            self.fail(f"{text!r} is not a type this reader knows (interval and variant types "
                      "are not read without Spark)")
        if name == "string" and self.word("collate"):
            self.fail("collated strings are not read without Spark")
        return atomic()

    def fields(self, stop: str | None) -> list[Any]:
        """``name [:] type [NOT NULL] [COMMENT '...']`` separated by commas, up to ``stop``
        (a closing ``>``) or the end."""
        from pyspark.sql import types as T

        fields = []
        while True:
            kind, name = self.take()
            if kind not in ("name", "quoted"):
                self.fail(f"expected a column name, got {name!r}")
            if self.peek() == ("punct", ":"):
                self.take()
            data_type = self.data_type()
            nullable = True
            if self.word("not"):
                if not self.word("null"):
                    self.fail("NOT must be followed by NULL")
                nullable = False
            metadata: dict[str, Any] = {}
            if self.word("comment"):
                kind, comment = self.take()
                if kind != "string":
                    self.fail(f"COMMENT takes a quoted string, got {comment!r}")
                metadata["comment"] = re.sub(r"\\(.)", r"\1", comment[1:-1])
            fields.append(T.StructField(name, data_type, nullable, metadata or None))
            following = self.peek()
            if following == ("punct", ","):
                self.take()
                continue
            if following[0] == "end" and stop is None:
                return fields
            if stop is not None and following == ("punct", stop):
                return fields
            self.fail(f"unexpected {following[1]!r} after column {name!r}")


def struct_of(ddl: Any, what: str = "schema") -> Any:
    """A Spark DDL struct string (or a ``StructType``, returned as it is) as a ``StructType``,
    read in Python (module docs).

    Parameters
    ----------
    ddl : str or pyspark.sql.types.StructType
        ``"a int, b string"`` or ``"struct<a: int, b: string>"``.
    what : str
        What the string is (``"output_schema"``, ``"state_schema"``), named in errors.

    Returns
    -------
    pyspark.sql.types.StructType

    Raises
    ------
    InvalidArgumentTypeError
        ``ddl`` is neither a str nor a StructType.
    InvalidArgumentError
        ``ddl`` is not a DDL struct (a bare type such as ``"int"``, a syntax error, or a type
        not read without Spark), the message saying where.

    Notes
    -----
    Cost: O(len(ddl)), no JVM.

    Examples
    --------
    >>> struct_of("struct<k: string, n: bigint>").simpleString()
    'struct<k:string,n:bigint>'
    >>> struct_of("int", "output_schema")
    Traceback (most recent call last):
    ...
    trilink_spark.errors.InvalidArgumentError: output_schema 'int' is not a Spark DDL struct (it describes int, not a struct)
    """
    from pyspark.sql.types import StructType

    if isinstance(ddl, StructType):
        return ddl
    if not isinstance(ddl, str):
        raise InvalidArgumentTypeError(
            f"{what} must be a Spark DDL string or a StructType, got {type(ddl).__name__}")
    parser = _Parser(ddl, what)
    if not parser.tokens:
        return StructType([])
    after = parser.peek(1)
    bare = after[0] == "end" or after == ("punct", "(") or (
        after == ("punct", "<") and parser.peek()[1].lower() in ("struct", "array", "map"))
    if bare:  # one type, not a list of fields
        found = parser.data_type()
        if parser.peek()[0] != "end":
            parser.fail(f"unexpected {parser.peek()[1]!r} after the type")
        if not isinstance(found, StructType):
            parser.fail(f"it describes {found.simpleString()}, not a struct")
        return found
    return StructType(parser.fields(None))
