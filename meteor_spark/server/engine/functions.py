"""Java functions clients send (a ring's read filter, an AtomicLong's ``apply``/``alter``): the embedded member runs
no Java code, so it refuses every one, with the error a Hazelcast member gives when the value is no function at all.
"""

from __future__ import annotations

from meteor_spark.server.errors import ClassCast, HazelcastSerialization, ServerError, UnsupportedOperation

_JAVA_BASE_TYPES = {
    -3: "java.lang.Byte",
    -4: "java.lang.Boolean",
    -5: "java.lang.Character",
    -6: "java.lang.Short",
    -7: "java.lang.Integer",
    -8: "java.lang.Long",
    -9: "java.lang.Float",
    -10: "java.lang.Double",
    -11: "java.lang.String",
    -12: "[B",
    -13: "[Z",
    -14: "[C",
    -15: "[S",
    -16: "[I",
    -17: "[J",
    -18: "[F",
    -19: "[D",
    -20: "[Ljava.lang.String;",
    -21: "java.util.UUID",
    -29: "java.util.ArrayList",
    -30: "java.util.LinkedList",
}
"""Hazelcast serialization type ids of JDK values, and the Java class a member deserializes each into."""

_DATA_SERIALIZABLE = -2
_DATA_HEADER = 8
"""A serialized value starts with its partition hash and its serializer's type id (4 bytes each, big-endian)."""


def refuse_java_function(data: bytes, unsupported: str) -> ServerError:
    """The error to answer a request carrying ``data`` where a Java ``IFunction`` belongs, as a Hazelcast member
    answers it where it can tell.

    A JDK value (a string, a number, a list: what a Python client sends for anything that is not a registered Java
    class) fails on a member with a ``ClassCastException`` naming the value's class, and so it does here; a
    Java-registered class of an unknown factory fails to deserialize there and here alike. Any other value (a real
    ``IFunction`` a Java client could send) is ``UnsupportedOperation(unsupported)``: say there how to do without.
    """
    type_id = int.from_bytes(data[4:_DATA_HEADER], "big", signed=True) if len(data) >= _DATA_HEADER else None
    java_class = _JAVA_BASE_TYPES.get(type_id) if type_id is not None else None
    if java_class is not None:
        return ClassCast(
            f"class {java_class} cannot be cast to class com.hazelcast.core.IFunction ({java_class} is in module "
            "java.base of loader 'bootstrap'; com.hazelcast.core.IFunction is in unnamed module of loader 'app')"
        )
    if type_id == _DATA_SERIALIZABLE and len(data) >= _DATA_HEADER + 9 and data[_DATA_HEADER]:
        factory_id = int.from_bytes(data[_DATA_HEADER + 1 : _DATA_HEADER + 5], "big", signed=True)
        if factory_id > 0:  # Hazelcast's own factories have negative ids
            return HazelcastSerialization(f"No DataSerializerFactory registered for namespace: {factory_id}")
    return UnsupportedOperation(unsupported)
