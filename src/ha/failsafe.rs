//! Failsafe while etcd does not answer (Patroni's `failsafe_mode`): a
//! frozen, restarting or re-electing etcd must not stop a farm whose
//! schedulers and daemons are all well.
//!
//! The leader, once a renewal is overdue, asks every instance it learnt of
//! from the election (while etcd answered) whether it leads. If every one
//! confirms that it does not, the leader's fence moves to when it asked
//! plus the lease's TTL (less the fence's margin), as a renewal would have
//! moved it; one that denies or does not answer leaves the fence where the
//! last renewal put it, so the leader steps down within its lease as
//! before. An instance that confirmed does not lead until the TTL has run
//! from its last confirmation: every fence a confirmation moved has closed
//! by then (the leader asked before the instance answered). An instance
//! that etcd answers denies: it may win once the lease runs out, so the
//! leader must step down in time (a leader alone cut off from etcd).
//!
//! The calls are authenticated with an HMAC-SHA256 keyed by a secret both
//! instances are given (`--ha_failsafe_secret_file`), over the sender, its
//! wall-clock time and a nonce; a receiver admits a question only within
//! [`REPLAY_WINDOW`] of its own clock and only once (nonces are kept for
//! the window), and the answer's HMAC covers the nonce, so neither can be
//! replayed or forged by someone who can reach the port.
//!
//! Everything here is a rule on values and times; the election task and
//! the HTTP route do the I/O.

use std::{
    collections::{HashSet, VecDeque},
    time::Duration,
};

use sha2::{Digest, Sha256};
use tokio::time::Instant;

/// The route instances ask each other on.
pub const PATH: &str = "/ha/failsafe";
/// How far a question's time may be from the receiver's clock: the two
/// machines' clocks must agree this well (NTP does far better).
pub const REPLAY_WINDOW: Duration = Duration::from_secs(5);
/// Nonces kept at most: a flood of valid questions cannot grow memory.
const MAX_NONCES: usize = 4096;
/// The shortest secret accepted: an HMAC key of fewer bytes is guessable.
pub const MIN_SECRET_BYTES: usize = 16;

/// HMAC-SHA256 (RFC 2104) of `message` under `key`.
pub fn hmac_sha256(key: &[u8], message: &[u8]) -> [u8; 32] {
    const BLOCK: usize = 64;
    let mut padded = [0u8; BLOCK];
    if key.len() > BLOCK {
        padded[..32].copy_from_slice(&Sha256::digest(key));
    } else {
        padded[..key.len()].copy_from_slice(key);
    }
    let inner_key: Vec<u8> = padded.iter().map(|byte| byte ^ 0x36).collect();
    let outer_key: Vec<u8> = padded.iter().map(|byte| byte ^ 0x5c).collect();
    let inner = Sha256::new()
        .chain_update(&inner_key)
        .chain_update(message)
        .finalize();
    Sha256::new()
        .chain_update(&outer_key)
        .chain_update(inner)
        .finalize()
        .into()
}

fn mac_matches(secret: &[u8], message: &[u8], mac_hex: &str) -> bool {
    use subtle::ConstantTimeEq;
    let Ok(mac) = hex::decode(mac_hex) else {
        return false;
    };
    mac.ct_eq(&hmac_sha256(secret, message)).into()
}

/// A leader's question: "do you lead?".
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Question {
    /// The asking instance's name (what it proclaims in the election).
    pub sender: String,
    /// The sender's wall clock, milliseconds since the Unix epoch.
    pub sent_unix_ms: u64,
    pub nonce: u64,
}

impl Question {
    fn signed_part(&self) -> String {
        format!("q1 {} {} {}", self.sender, self.sent_unix_ms, self.nonce)
    }

    /// The request body: the fields and their HMAC, one line.
    pub fn encode(&self, secret: &[u8]) -> String {
        let signed = self.signed_part();
        let mac = hex::encode(hmac_sha256(secret, signed.as_bytes()));
        format!("{signed} {mac}")
    }

    /// The question in `body`, if its HMAC is right.
    pub fn decode(body: &str, secret: &[u8]) -> Result<Question, Refusal> {
        let fields: Vec<&str> = body.trim().split(' ').collect();
        let [version, sender, sent, nonce, mac] = fields[..] else {
            return Err(Refusal::Malformed);
        };
        let (Ok(sent_unix_ms), Ok(nonce)) = (sent.parse(), nonce.parse()) else {
            return Err(Refusal::Malformed);
        };
        if version != "q1" || sender.is_empty() {
            return Err(Refusal::Malformed);
        }
        let question = Question {
            sender: sender.to_owned(),
            sent_unix_ms,
            nonce,
        };
        if !mac_matches(secret, question.signed_part().as_bytes(), mac) {
            return Err(Refusal::BadMac);
        }
        Ok(question)
    }
}

/// Why a question was not answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    Malformed,
    BadMac,
    /// Its time is outside [`REPLAY_WINDOW`] of this instance's clock.
    Stale,
    /// Its nonce was seen already.
    Replayed,
}

impl Refusal {
    pub fn describe(self) -> &'static str {
        match self {
            Refusal::Malformed => "malformed failsafe question",
            Refusal::BadMac => "failsafe question not signed with the shared secret",
            Refusal::Stale => "failsafe question too old or from the future (clocks apart?)",
            Refusal::Replayed => "failsafe question replayed",
        }
    }
}

/// What an instance answers a question.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// It does not lead, and will not until the TTL has run from now.
    Confirmed,
    /// It leads, or etcd answers it (it may win once the lease runs out).
    Denied,
}

impl Answer {
    fn word(self) -> &'static str {
        match self {
            Answer::Confirmed => "confirm",
            Answer::Denied => "deny",
        }
    }

    fn signed_part(self, responder: &str, nonce: u64) -> String {
        format!("a1 {} {responder} {nonce}", self.word())
    }

    /// The answer's body, bound to the question's nonce.
    pub fn encode(self, responder: &str, nonce: u64, secret: &[u8]) -> String {
        let signed = self.signed_part(responder, nonce);
        let mac = hex::encode(hmac_sha256(secret, signed.as_bytes()));
        format!("{signed} {mac}")
    }

    /// The answer in `body` to the question with `nonce`, from `responder`;
    /// None if it is not one (wrong HMAC, another question's, garbled).
    pub fn decode(body: &str, responder: &str, nonce: u64, secret: &[u8]) -> Option<Answer> {
        let (signed, mac) = body.trim().rsplit_once(' ')?;
        [Answer::Confirmed, Answer::Denied]
            .into_iter()
            .find(|answer| answer.signed_part(responder, nonce) == signed)
            .filter(|_| mac_matches(secret, signed.as_bytes(), mac))
    }
}

/// Questions admitted once each, within [`REPLAY_WINDOW`].
#[derive(Debug, Default)]
pub struct ReplayGuard {
    /// Admitted (time, nonce), oldest first.
    order: VecDeque<(u64, u64)>,
    seen: HashSet<u64>,
}

impl ReplayGuard {
    /// Admits `question` at `now_unix_ms` (this instance's wall clock), or
    /// says why not.
    pub fn admit(&mut self, question: &Question, now_unix_ms: u64) -> Result<(), Refusal> {
        let window = REPLAY_WINDOW.as_millis() as u64;
        if question.sent_unix_ms.abs_diff(now_unix_ms) > window {
            return Err(Refusal::Stale);
        }
        // What is older than the window is refused as stale anyway.
        while let Some(&(sent, nonce)) = self.order.front() {
            if sent + 2 * window >= now_unix_ms && self.order.len() < MAX_NONCES {
                break;
            }
            self.order.pop_front();
            self.seen.remove(&nonce);
        }
        if !self.seen.insert(question.nonce) {
            return Err(Refusal::Replayed);
        }
        self.order
            .push_back((question.sent_unix_ms, question.nonce));
        Ok(())
    }
}

/// A standby's side: what it answers, and how long a confirmation keeps it
/// from leading.
#[derive(Debug)]
pub struct Confirmations {
    ttl: Duration,
    last_confirmed: Option<Instant>,
}

impl Confirmations {
    pub fn new(ttl: Duration) -> Self {
        Confirmations {
            ttl,
            last_confirmed: None,
        }
    }

    /// The answer at `now` of an instance that `leads` (or won and waits)
    /// and that etcd answers (`etcd_answers`) or not.
    pub fn answer(&mut self, now: Instant, leads: bool, etcd_answers: bool) -> Answer {
        if leads || etcd_answers {
            return Answer::Denied;
        }
        self.last_confirmed = Some(now);
        Answer::Confirmed
    }

    /// Until when this instance may not lead (None: it may now): the TTL
    /// from its last confirmation, by which every fence that confirmation
    /// moved has closed.
    pub fn hold_until(&self, now: Instant) -> Option<Instant> {
        self.last_confirmed
            .map(|at| at + self.ttl)
            .filter(|until| *until > now)
    }
}

/// The leader's side: how far a round of questions asked at `asked` moves
/// the fence. Some only if it knows of at least one other instance and
/// every one it knows of confirmed (alone, it cannot tell a partition in
/// which another instance reaches etcd from etcd being down).
pub fn fence_after_round(
    asked: Instant,
    fence_ttl: Duration,
    known: &[String],
    answers: &[(String, Option<Answer>)],
) -> Option<Instant> {
    let confirmed = |name: &String| {
        answers
            .iter()
            .any(|(from, answer)| from == name && *answer == Some(Answer::Confirmed))
    };
    (!known.is_empty() && known.iter().all(confirmed)).then(|| asked + fence_ttl)
}

/// Whether the leader should ask now: a renewal is overdue (the fence is
/// less than `fence_ttl - renew_every` ahead: it would be about `fence_ttl`
/// ahead right after a renewal).
pub fn renewal_overdue(
    now: Instant,
    fence: Instant,
    fence_ttl: Duration,
    renew_every: Duration,
) -> bool {
    fence.saturating_duration_since(now) + renew_every < fence_ttl
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &[u8] = b"a shared failsafe secret";

    #[test]
    fn hmac_matches_rfc_4231() {
        // Test case 2.
        let mac = hmac_sha256(b"Jefe", b"what do ya want for nothing?");
        assert_eq!(
            hex::encode(mac),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
        // Test case 6: a key longer than the block is hashed first.
        let mac = hmac_sha256(
            &[0xaa; 131],
            b"Test Using Larger Than Block-Size Key - Hash Key First",
        );
        assert_eq!(
            hex::encode(mac),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"
        );
    }

    fn question() -> Question {
        Question {
            sender: "sched-a:8336".to_owned(),
            sent_unix_ms: 1_000_000,
            nonce: 42,
        }
    }

    #[test]
    fn a_question_is_read_back_only_with_the_secret_and_untouched() {
        let body = question().encode(SECRET);
        assert_eq!(Question::decode(&body, SECRET), Ok(question()));
        assert_eq!(
            Question::decode(&body, b"another secret of enough bytes"),
            Err(Refusal::BadMac)
        );
        let forged = body.replace("sched-a", "sched-x");
        assert_eq!(Question::decode(&forged, SECRET), Err(Refusal::BadMac));
        let later = body.replace("1000000", "1000001");
        assert_eq!(Question::decode(&later, SECRET), Err(Refusal::BadMac));
        for garbled in ["", "q1 a 1 2", "q2 a 1 2 00", "q1 a x 2 00", "q1  1 2 00"] {
            assert_eq!(
                Question::decode(garbled, SECRET),
                Err(Refusal::Malformed),
                "{garbled:?}"
            );
        }
    }

    #[test]
    fn an_answer_counts_only_for_its_question_and_responder() {
        let body = Answer::Confirmed.encode("sched-b:8336", 42, SECRET);
        assert_eq!(
            Answer::decode(&body, "sched-b:8336", 42, SECRET),
            Some(Answer::Confirmed)
        );
        // Replayed for another question, or from another instance.
        assert_eq!(Answer::decode(&body, "sched-b:8336", 43, SECRET), None);
        assert_eq!(Answer::decode(&body, "sched-c:8336", 42, SECRET), None);
        assert_eq!(Answer::decode(&body, "sched-b:8336", 42, b"wrong"), None);
        // A denial cannot be turned into a confirmation.
        let denied = Answer::Denied.encode("sched-b:8336", 42, SECRET);
        let turned = denied.replace("deny", "confirm");
        assert_eq!(Answer::decode(&turned, "sched-b:8336", 42, SECRET), None);
        assert_eq!(
            Answer::decode(&denied, "sched-b:8336", 42, SECRET),
            Some(Answer::Denied)
        );
        assert_eq!(Answer::decode("", "sched-b:8336", 42, SECRET), None);
    }

    #[test]
    fn a_question_is_admitted_once_and_only_near_the_receivers_clock() {
        let mut guard = ReplayGuard::default();
        let asked = question();
        let now = asked.sent_unix_ms + 100;
        assert_eq!(guard.admit(&asked, now), Ok(()));
        assert_eq!(guard.admit(&asked, now + 10), Err(Refusal::Replayed));
        let window = REPLAY_WINDOW.as_millis() as u64;
        let old = Question {
            nonce: 7,
            ..question()
        };
        assert_eq!(
            guard.admit(&old, old.sent_unix_ms + window + 1),
            Err(Refusal::Stale)
        );
        assert_eq!(
            guard.admit(&old, old.sent_unix_ms - window - 1),
            Err(Refusal::Stale),
            "from the future"
        );
        // Long after, the first nonce is forgotten, and its question stale.
        let much_later = asked.sent_unix_ms + 3 * window;
        assert_eq!(guard.admit(&asked, much_later), Err(Refusal::Stale));
        let fresh = Question {
            sent_unix_ms: much_later,
            nonce: 8,
            ..question()
        };
        assert_eq!(guard.admit(&fresh, much_later), Ok(()));
        assert_eq!(guard.seen.len(), 1, "nonces outside the window are dropped");
    }

    #[test]
    fn the_nonces_kept_are_bounded() {
        let mut guard = ReplayGuard::default();
        for nonce in 0..(MAX_NONCES as u64 * 2) {
            let asked = Question {
                nonce,
                ..question()
            };
            assert_eq!(guard.admit(&asked, asked.sent_unix_ms), Ok(()));
        }
        assert!(guard.seen.len() <= MAX_NONCES);
    }

    const TTL: Duration = Duration::from_secs(3);

    #[tokio::test(start_paused = true)]
    async fn a_standby_that_confirmed_does_not_lead_until_the_ttl_ran_from_its_last_confirmation() {
        let mut standby = Confirmations::new(TTL);
        assert_eq!(standby.hold_until(Instant::now()), None);
        assert_eq!(
            standby.answer(Instant::now(), false, false),
            Answer::Confirmed
        );
        let first = Instant::now();
        tokio::time::advance(Duration::from_secs(2)).await;
        assert_eq!(standby.hold_until(Instant::now()), Some(first + TTL));
        // Each confirmation holds it off anew.
        assert_eq!(
            standby.answer(Instant::now(), false, false),
            Answer::Confirmed
        );
        let second = Instant::now();
        tokio::time::advance(Duration::from_secs(2)).await;
        assert_eq!(standby.hold_until(Instant::now()), Some(second + TTL));
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(standby.hold_until(Instant::now()), None, "the TTL has run");
    }

    #[tokio::test(start_paused = true)]
    async fn a_leader_or_an_instance_etcd_answers_denies_and_is_not_held_off() {
        let mut standby = Confirmations::new(TTL);
        assert_eq!(standby.answer(Instant::now(), true, false), Answer::Denied);
        assert_eq!(standby.answer(Instant::now(), false, true), Answer::Denied);
        assert_eq!(standby.hold_until(Instant::now()), None);
    }

    #[tokio::test(start_paused = true)]
    async fn the_fence_moves_only_when_every_known_instance_confirmed() {
        let asked = Instant::now();
        let fence_ttl = TTL - TTL / 10;
        let known = vec!["b:1".to_owned(), "c:1".to_owned()];
        let both = vec![
            ("b:1".to_owned(), Some(Answer::Confirmed)),
            ("c:1".to_owned(), Some(Answer::Confirmed)),
        ];
        assert_eq!(
            fence_after_round(asked, fence_ttl, &known, &both),
            Some(asked + fence_ttl)
        );
        for partial in [
            vec![("b:1".to_owned(), Some(Answer::Confirmed))],
            vec![
                ("b:1".to_owned(), Some(Answer::Confirmed)),
                ("c:1".to_owned(), None),
            ],
            vec![
                ("b:1".to_owned(), Some(Answer::Confirmed)),
                ("c:1".to_owned(), Some(Answer::Denied)),
            ],
        ] {
            assert_eq!(
                fence_after_round(asked, fence_ttl, &known, &partial),
                None,
                "{partial:?}"
            );
        }
        assert_eq!(
            fence_after_round(asked, fence_ttl, &[], &[]),
            None,
            "alone it cannot tell etcd down from itself cut off"
        );
    }

    /// The safety of the whole: the fence a confirmation moved closes
    /// before the confirming instance may lead, whatever the delays.
    #[tokio::test(start_paused = true)]
    async fn no_fence_a_confirmation_moved_outlasts_the_confirmers_hold() {
        let fence_ttl = TTL - TTL / 10;
        let mut standby = Confirmations::new(TTL);
        for delay_ms in [0u64, 1, 150, 300, 1999] {
            let asked = Instant::now();
            tokio::time::advance(Duration::from_millis(delay_ms)).await;
            let answer = standby.answer(Instant::now(), false, false);
            let fence = fence_after_round(
                asked,
                fence_ttl,
                &["b:1".to_owned()],
                &[("b:1".to_owned(), Some(answer))],
            )
            .expect("confirmed");
            let hold = standby.hold_until(Instant::now()).expect("held off");
            assert!(fence < hold, "delay {delay_ms} ms");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_round_is_due_once_a_renewal_is_overdue() {
        let fence_ttl = Duration::from_millis(2700);
        let every = Duration::from_secs(1);
        let renewed_fence = Instant::now() + fence_ttl;
        assert!(!renewal_overdue(
            Instant::now(),
            renewed_fence,
            fence_ttl,
            every
        ));
        tokio::time::advance(Duration::from_millis(900)).await;
        assert!(!renewal_overdue(
            Instant::now(),
            renewed_fence,
            fence_ttl,
            every
        ));
        tokio::time::advance(Duration::from_millis(200)).await;
        assert!(renewal_overdue(
            Instant::now(),
            renewed_fence,
            fence_ttl,
            every
        ));
    }
}
