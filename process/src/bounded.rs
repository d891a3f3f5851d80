//! One API call, bounded in time: kube's client has no read timeout (a global one would cut the
//! watches), so without a bound a hung call would stall its caller for good.
//!
//! ```text
//! call ─► tokio::time::timeout(limit) ─► its result, or kube::Error::Service(elapsed) like any other error
//! ```

use std::future::Future;
use std::time::Duration;

/// The default bound for one API call outside the watches: the agent's status writes and plan
/// reads, the controller's writes (`Options::api_timeout` unless a test sets another).
pub const API_CALL_TIMEOUT: Duration = Duration::from_secs(15);

/// Runs `call` for at most `limit`; a timeout is an error like any other.
pub async fn bounded<T>(
    limit: Duration,
    call: impl Future<Output = Result<T, kube::Error>>,
) -> Result<T, kube::Error> {
    tokio::time::timeout(limit, call)
        .await
        .unwrap_or_else(|elapsed| Err(kube::Error::Service(Box::new(elapsed))))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_call_that_hangs_is_an_error_once_the_limit_passes() {
        let hung = bounded(
            Duration::from_secs(2),
            std::future::pending::<Result<(), kube::Error>>(),
        )
        .await;
        assert!(matches!(hung, Err(kube::Error::Service(_))), "{hung:?}");
        let quick = bounded(Duration::from_secs(2), async { Ok::<_, kube::Error>(7) }).await;
        assert_eq!(quick.ok(), Some(7));
    }
}
