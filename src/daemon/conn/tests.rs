use tokio::net::TcpListener;

use super::*;

/// A connection served here, and its caller's end of the socket.
async fn pair(write_timeout: Duration) -> (Connection, TcpStream, watch::Sender<bool>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let caller = TcpStream::connect(listener.local_addr().unwrap())
        .await
        .unwrap();
    let (served, _) = listener.accept().await.unwrap();
    let (stop, stop_changes) = watch::channel(false);
    let connection = Connection::open(
        served,
        BytesMut::new(),
        ConnectionBudget::new(
            &crate::edge::BodyBudget::new(1 << 20),
            std::net::Ipv4Addr::LOCALHOST.into(),
            crate::edge::Proof::proved(),
        ),
        Duration::from_secs(60),
        write_timeout,
        stop_changes,
    );
    (connection, caller, stop)
}

#[tokio::test]
async fn answers_arrive_whole_in_the_order_sent_then_the_end_of_stream() {
    let (connection, mut caller, _stop) = pair(Duration::from_secs(10)).await;
    // Small answers the socket takes at once, and answers larger than its
    // buffer, which the writer task finishes while more queue behind them.
    // Every fiftieth answer carries one shared 3 MiB payload.
    let shared = Bytes::from(vec![7u8; 3 << 20]);
    let answers: Vec<QueuedAnswer> = (0..300u32)
        .map(|index| {
            let head = Bytes::from(vec![(index % 251) as u8; 20 + index as usize % 40]);
            let payload = if index % 50 == 7 {
                shared.clone()
            } else {
                Bytes::from(vec![(index % 13) as u8; index as usize])
            };
            QueuedAnswer::new(head, payload)
        })
        .collect();
    let expected: Vec<u8> = answers.iter().flat_map(QueuedAnswer::to_vec).collect();
    let reading = tokio::spawn(async move {
        let mut received = Vec::new();
        caller.read_to_end(&mut received).await.unwrap();
        received
    });
    let senders: Vec<AnswerSender> = (0..3).map(|_| connection.answers.clone()).collect();
    for (index, answer) in answers.into_iter().enumerate() {
        senders[index % 3].send(answer).await.unwrap();
    }
    drop(senders);
    connection.finish().await;
    let received = tokio::time::timeout(Duration::from_secs(30), reading)
        .await
        .expect("the end of stream follows the last answer")
        .unwrap();
    assert_eq!(received.len(), expected.len());
    assert!(received == expected, "answers arrived out of order or torn");
}

#[tokio::test]
async fn no_call_is_read_while_the_answers_queued_exceed_the_bound() {
    let (mut connection, mut caller, _stop) = pair(Duration::from_secs(30)).await;
    // One shared payload: the bound counts the bytes each answer puts on
    // the wire, shared or not.
    let payload = Bytes::from(vec![3u8; 1 << 20]);
    let answer = QueuedAnswer::new(Bytes::from_static(b"head"), payload.clone());
    let bound = crate::edge::answer_queue_bound(answer.len());
    let answers = connection.answers.clone();
    let sending = tokio::spawn(async move {
        loop {
            answers.send(answer.clone()).await.unwrap();
        }
    });
    // The caller reads nothing: the queue fills past the bound (less
    // what the socket buffers took), then the sender waits, and the
    // connection takes no new call.
    let queued = || connection.answers.outbox.lock().bytes;
    let filled = tokio::time::timeout(Duration::from_secs(10), async {
        while queued() <= bound {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    });
    filled.await.expect("the queue fills past its bound");
    let waiting =
        tokio::time::timeout(Duration::from_millis(500), connection.wait_for_room()).await;
    assert!(waiting.is_err(), "the reader waits for room");
    let queued = connection.answers.outbox.lock().bytes;
    assert!(
        queued > bound && queued <= bound + 2 * (1 << 20),
        "{queued} bytes queued for a bound of {bound}"
    );
    // Once the caller reads, there is room again.
    sending.abort();
    let reading = tokio::spawn(async move {
        let mut chunk = vec![0u8; 1 << 16];
        loop {
            if caller.read(&mut chunk).await.unwrap_or(0) == 0 {
                return;
            }
        }
    });
    let resumed = tokio::time::timeout(Duration::from_secs(10), connection.wait_for_room()).await;
    assert_eq!(resumed.expect("room once the caller reads"), None);
    reading.abort();
}

#[tokio::test]
async fn a_caller_that_stops_reading_is_cut_off_after_the_write_timeout() {
    let (connection, _caller, _stop) = pair(Duration::from_millis(200)).await;
    let answer = QueuedAnswer::new(Bytes::from_static(b"head"), Bytes::from(vec![1u8; 1 << 20]));
    let started = std::time::Instant::now();
    let mut sent = 0;
    let refused = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            if connection.answers.send(answer.clone()).await.is_err() {
                return;
            }
            sent += 1;
        }
    })
    .await;
    assert!(refused.is_ok(), "still sending after {sent} MiB unread");
    assert!(
        started.elapsed() >= Duration::from_millis(200),
        "cut off only once a write made no progress for the timeout"
    );
    // Nothing more goes out on a connection that was cut off.
    assert_eq!(
        connection
            .answers
            .send(QueuedAnswer::new(Bytes::from_static(b"x"), Bytes::new()))
            .await,
        Err(Broken)
    );
}

#[tokio::test]
async fn a_connection_dropped_unfinished_closes_its_socket() {
    // What a standby does to the daemon connections it held: drops them.
    let (connection, mut caller, _stop) = pair(Duration::from_secs(10)).await;
    drop(connection);
    let mut rest = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), caller.read_to_end(&mut rest))
        .await
        .expect("the caller sees the end of the stream, not silence");
    assert_eq!(read.unwrap(), 0);
}
