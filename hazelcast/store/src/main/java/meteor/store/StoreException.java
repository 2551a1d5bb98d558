package meteor.store;

/**
 * A store call that failed: the database refused it or could not be reached. Hazelcast fails the operation that
 * called the store (the publish, the put), so nothing is acknowledged that the database does not hold.
 */
public final class StoreException extends RuntimeException {
    private static final long serialVersionUID = 1L;

    StoreException(String message, Throwable cause) {
        super(message, cause);
    }
}
