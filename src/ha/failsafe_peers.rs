//! The I/O of [`super::failsafe`]: which instances the election names (read
//! while etcd answers), the leader's questions to them, and a standby's
//! side of the call (its state lives in [`super::Leadership`]).

use std::{
    sync::{Arc, Mutex, PoisonError},
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
    time::{Instant, sleep, timeout},
};

use super::{
    connection::EtcdConnection,
    etcd::etcdserverpb::{RangeRequest, kv_client::KvClient},
    failsafe::{self, Answer, Confirmations, Question, ReplayGuard},
};

/// A question unanswered this long counts as "cannot reach": a leader must
/// decide well within its lease.
pub const ASK_TIMEOUT: Duration = Duration::from_millis(500);
/// The longest answer read.
const MAX_ANSWER_BYTES: usize = 4096;

/// What an instance with `--ha_failsafe_secret_file` holds for the calls.
#[derive(Debug)]
pub struct FailsafeState {
    pub secret: crate::engine::Redacted<Vec<u8>>,
    /// This instance's name, set when the election starts.
    pub instance: String,
    pub confirmations: Mutex<Confirmations>,
    replay: Mutex<ReplayGuard>,
    /// etcd answered this instance within this long: it reaches etcd.
    pub etcd_recent: Duration,
}

impl FailsafeState {
    /// `ttl`: the lease's; `renew_every`: how often etcd is asked to
    /// renew it (an instance whose last answer is older does not reach etcd).
    pub fn new(secret: Vec<u8>, instance: String, ttl: Duration, renew_every: Duration) -> Self {
        FailsafeState {
            secret: crate::engine::Redacted(secret),
            instance,
            confirmations: Mutex::new(Confirmations::new(ttl)),
            replay: Mutex::new(ReplayGuard::default()),
            etcd_recent: renew_every,
        }
    }

    /// A standby's answer to the question in `body`: the answer's body, or
    /// why it was refused. `leads` and `etcd_answers` are read by the
    /// caller at the moment of answering.
    pub fn answer(&self, body: &str, leads: bool, etcd_answers: bool) -> Result<String, String> {
        let question = Question::decode(body, &self.secret)
            .map_err(|refusal| refusal.describe().to_owned())?;
        self.replay
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .admit(&question, unix_ms())
            .map_err(|refusal| refusal.describe().to_owned())?;
        let answer = self
            .confirmations
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .answer(Instant::now(), leads, etcd_answers);
        Ok(answer.encode(&self.instance, question.nonce, &self.secret))
    }

    /// Until when a confirmation keeps this instance from leading.
    pub fn hold_until(&self) -> Option<Instant> {
        self.confirmations
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .hold_until(Instant::now())
    }
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_millis() as u64)
}

/// Asks every instance of `known` whether it leads, at once; each answer
/// (None: no valid one in time) with its instance.
pub async fn ask_all(state: &FailsafeState, known: &[String]) -> Vec<(String, Option<Answer>)> {
    let asks = known.iter().map(|peer| async move {
        let nonce = rand::random::<u64>();
        let question = Question {
            sender: state.instance.clone(),
            sent_unix_ms: unix_ms(),
            nonce,
        };
        let body = question.encode(&state.secret);
        let answer = timeout(ASK_TIMEOUT, ask(peer, &body))
            .await
            .ok()
            .flatten()
            .and_then(|text| Answer::decode(&text, peer, nonce, &state.secret));
        (peer.clone(), answer)
    });
    futures_util::future::join_all(asks).await
}

/// One POST of `body` to `peer` (`host:port`): the answer's body if 200.
async fn ask(peer: &str, body: &str) -> Option<String> {
    let mut stream = TcpStream::connect(peer).await.ok()?;
    let request = format!(
        "POST {} HTTP/1.1\r\nHost: {peer}\r\nContent-Type: text/plain\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        failsafe::PATH,
        body.len()
    );
    stream.write_all(request.as_bytes()).await.ok()?;
    let mut answer = Vec::new();
    let mut chunk = [0u8; 1024];
    while answer.len() < MAX_ANSWER_BYTES {
        let read = stream.read(&mut chunk).await.ok()?;
        if read == 0 {
            break;
        }
        answer.extend_from_slice(&chunk[..read]);
    }
    let text = String::from_utf8(answer).ok()?;
    let (head, body) = text.split_once("\r\n\r\n")?;
    head.starts_with("HTTP/1.1 200").then(|| body.to_owned())
}

/// Keeps `known` to the instances (but `instance`) that campaign in
/// election `name`, read every `every` while etcd answers: what a leader
/// asks when etcd stops answering.
pub async fn follow_members(
    etcd: EtcdConnection,
    name: String,
    instance: String,
    every: Duration,
    known: Arc<Mutex<Vec<String>>>,
) {
    // The keys etcd's election puts: `name/<lease id>`.
    let prefix = format!("{name}/").into_bytes();
    let mut end = prefix.clone();
    if let Some(last) = end.last_mut() {
        *last += 1;
    }
    loop {
        let range = etcd.call(|service| {
            let request = RangeRequest {
                key: prefix.clone(),
                range_end: end.clone(),
                ..RangeRequest::default()
            };
            async move { KvClient::new(service).range(request).await }
        });
        if let Ok(Ok(answer)) = timeout(every, range).await {
            let mut members: Vec<String> = answer
                .into_inner()
                .kvs
                .into_iter()
                .map(|kv| String::from_utf8_lossy(&kv.value).into_owned())
                .filter(|member| *member != instance && !member.is_empty())
                .collect();
            members.sort();
            members.dedup();
            *known.lock().unwrap_or_else(PoisonError::into_inner) = members;
        }
        sleep(every).await;
    }
}
