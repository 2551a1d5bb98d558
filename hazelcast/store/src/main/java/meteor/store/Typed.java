package meteor.store;

import java.nio.charset.StandardCharsets;

/**
 * A map key or value as a type tag and bytes: {@code s} for a String (UTF-8), {@code b} for a byte[] (as is).
 *
 * <p>Those are the types a Python client's map entries arrive as: it sends {@code str} and {@code bytearray} with
 * Hazelcast's built-in serializers, so the members (and this store) see String and byte[] (meteor-spark's maps
 * hold String keys and values). The tag makes both come back as the type they went in, so a compare-and-set after
 * a restart compares like with like.
 */
final class Typed {
    static final String STRING = "s";
    static final String BYTES = "b";

    final String type;
    final byte[] data;

    private Typed(String type, byte[] data) {
        this.type = type;
        this.data = data;
    }

    /**
     * @throws IllegalArgumentException any type but String and byte[]; the message names the map and the type
     */
    static Typed of(Object value, String what, String mapName) {
        if (value instanceof String) {
            return new Typed(STRING, ((String) value).getBytes(StandardCharsets.UTF_8));
        }
        if (value instanceof byte[]) {
            return new Typed(BYTES, (byte[]) value);
        }
        throw new IllegalArgumentException("meteor store: map " + mapName + " got a " + what + " of type "
                + (value == null ? "null" : value.getClass().getName())
                + "; this store keeps String and byte[] only (what meteor-spark writes)");
    }

    /** The value a tag and bytes read from the table stand for. */
    static Object decode(String type, byte[] data, String mapName) {
        if (STRING.equals(type)) {
            return new String(data, StandardCharsets.UTF_8);
        }
        if (BYTES.equals(type)) {
            return data;
        }
        throw new IllegalStateException("meteor store: map " + mapName + " has a row with the unknown type tag '"
                + type + "' in table " + JdbcDatabase.MAP_TABLE + "; it was not written by this store");
    }
}
