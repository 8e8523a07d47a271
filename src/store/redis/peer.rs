//! What the instances of the service tell each other through Redis: the denial cache's
//! invalidations, published on a channel every instance subscribes to, and the ring of ticket
//! keys they all sign and verify with.

use std::sync::LazyLock;
use std::time::Duration;

use redis::RedisError;

use super::RedisStore;
use crate::store::{key, StoreError};

impl RedisStore {
    /// Publishes `message` on `channel`, through the breaker and within the timeout like any
    /// call. On a Cluster any node takes it, and the cluster passes it to every node.
    pub async fn publish(&self, channel: &str, message: &str) -> Result<(), StoreError> {
        self.with_conn(async |conn| {
            let _receivers: i64 = redis::cmd("PUBLISH")
                .arg(channel)
                .arg(message)
                .query_async(conn)
                .await?;
            Ok(())
        })
        .await
    }

    /// Subscribes to `channel` on its own connection, at the first of the store's addresses
    /// that accepts within the timeout (a Cluster's messages reach every node): the
    /// subscription, whose messages end when its connection does.
    pub async fn subscribe(&self, channel: &str) -> Result<redis::aio::PubSub, StoreError> {
        let mut last = StoreError::unavailable("no address to subscribe at");
        for url in &self.pubsub_urls {
            let attempt = async {
                let client = redis::Client::open(url.as_str())?;
                let info = client.get_connection_info();
                let redis::ConnectionAddr::Tcp(host, port) = info.addr() else {
                    return Err(RedisError::from((
                        redis::ErrorKind::InvalidClientConfig,
                        "only host:port addresses are supported",
                    )));
                };
                // Our own socket, so that it goes over the store's TLS when it has one.
                let socket = tokio::net::TcpStream::connect((host.as_str(), *port)).await?;
                socket.set_nodelay(true)?;
                let mut pubsub = match &self.tls {
                    None => redis::aio::PubSub::new(info.redis_settings(), socket).await?,
                    Some(tls) => {
                        let stream = tls.handshake(host, *port, socket).await?;
                        redis::aio::PubSub::new(info.redis_settings(), stream).await?
                    }
                };
                pubsub.subscribe(channel).await?;
                Ok::<_, RedisError>(pubsub)
            };
            match tokio::time::timeout(self.calls.timeout.max(Duration::from_secs(1)), attempt)
                .await
            {
                Ok(Ok(pubsub)) => return Ok(pubsub),
                Ok(Err(e)) => last = e.into(),
                Err(_) => last = StoreError::unavailable("subscribing timed out"),
            }
        }
        Err(last)
    }

    /// The ring of ticket keys (see `service::ticket::Keyring`), after making `fresh` its first
    /// key if it has none: one `SET NX GET`, so that instances starting together agree.
    pub async fn ticket_keys(&self, fresh: &str) -> Result<String, StoreError> {
        let name = key::ticket_keys(&self.prefix);
        self.with_conn_on(Some(&name), async |conn| {
            let old: Option<String> = redis::cmd("SET")
                .arg(&name)
                .arg(fresh)
                .arg("NX")
                .arg("GET")
                .query_async(conn)
                .await?;
            Ok(old.unwrap_or_else(|| fresh.to_owned()))
        })
        .await
    }

    /// Rotates the ring of ticket keys in one script call: `fresh` becomes the current key,
    /// with the next id, and the current one the previous; the previous one is dropped. Answers
    /// the new ring. A call sent again (after a broken connection) finds `fresh` current already
    /// and changes nothing, so it never ends the tickets of the key it just retired.
    pub async fn rotate_ticket_keys(&self, fresh: &[u8]) -> Result<String, StoreError> {
        static ROTATE: LazyLock<redis::Script> = LazyLock::new(|| {
            redis::Script::new(
                "local cur = redis.call('GET', KEYS[1])\n\
                 local id, hex\n\
                 if cur then\n  id, hex = string.match(cur, '^(%d+):(%x+)')\nend\n\
                 if hex == ARGV[1] then\n  return cur\nend\n\
                 local text = '1:' .. ARGV[1]\n\
                 if id then\n  text = string.format('%d', tonumber(id) + 1) .. ':' .. ARGV[1] .. ' ' .. id .. ':' .. hex\nend\n\
                 redis.call('SET', KEYS[1], text)\n\
                 return text\n",
            )
        });
        let name = key::ticket_keys(&self.prefix);
        let hex: String = fresh.iter().map(|b| format!("{b:02x}")).collect();
        self.with_conn_on(Some(&name), async |conn| {
            Ok(ROTATE
                .key(name.as_str())
                .arg(hex.as_str())
                .invoke_async(conn)
                .await?)
        })
        .await
    }
    /// The channel of the denial cache's invalidations (see `service::denials`).
    pub fn denials_channel(&self) -> String {
        format!("{}:denials", self.prefix)
    }
}
