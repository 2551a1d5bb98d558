package meteor.store;

import com.hazelcast.ringbuffer.RingbufferStore;
import com.hazelcast.ringbuffer.RingbufferStoreFactory;
import java.util.Properties;

/**
 * The {@code factory-class-name} of a ring buffer configuration: one {@link JdbcRingbufferStore} per ring, so a
 * wildcard configuration ({@code meteor.stream::*}) covers every lane of every stream.
 */
public final class JdbcRingbufferStoreFactory implements RingbufferStoreFactory<Object> {
    @Override
    public RingbufferStore<Object> newRingbufferStore(String name, Properties properties) {
        return new JdbcRingbufferStore(name, StoreSettings.from(properties));
    }
}
