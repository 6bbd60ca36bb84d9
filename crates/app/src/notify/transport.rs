//! How a notification reaches a receiver: a webhook POST of its JSON (signed with HMAC-SHA256
//! when the receiver has a secret), a Slack-compatible incoming webhook (`{"text": ...}`), or a
//! mail over SMTP. Each says whether the receiver took it, refused it for good, or must be tried
//! again later.

use std::time::Duration;

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;
use tidegate_core::spec::{Endpoint, Receiver, ReceiverKind, SmtpTls};

use super::message::Notification;

/// The header carrying the signature: `sha256=HEX` of HMAC-SHA256(secret, `TIMESTAMP.BODY`).
pub const SIGNATURE_HEADER: &str = "x-tidegate-signature";
/// The header carrying the Unix time the signature covers.
pub const TIMESTAMP_HEADER: &str = "x-tidegate-timestamp";
/// The header carrying the notification's id (the same on every retry): receivers dedupe by it.
pub const DELIVERY_HEADER: &str = "x-tidegate-delivery";

/// How a receiver answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// It took the notification.
    Delivered,
    /// It refused it for good (a 4xx other than 408 and 429): sending it again cannot help.
    Refused(String),
    /// It is down, slow or overloaded, or a setting is missing: try again later.
    Later(String),
}

/// `sha256=HEX` of HMAC-SHA256(`secret`, `timestamp.body`): what a receiver recomputes to know
/// the body came from Tidegate and was not replayed from long ago.
pub fn signature(secret: &[u8], timestamp: i64, body: &[u8]) -> String {
    let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(secret) else { return String::new() };
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    let bytes = mac.finalize().into_bytes();
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256={hex}")
}

/// The URL of a webhook or Slack receiver, from the spec or its variable.
fn url(endpoint: &Endpoint) -> Result<String, String> {
    match endpoint {
        Endpoint::Url(u) => Ok(u.clone()),
        Endpoint::Env(var) => std::env::var(var)
            .ok()
            .filter(|v| !v.trim().is_empty())
            .ok_or_else(|| format!("the variable {var} (url_env) is not set in the environment of tidegate")),
    }
}

/// Delivers `n` to `receiver`, waiting at most its `timeout_s`.
pub async fn deliver(client: &reqwest::Client, receiver: &Receiver, n: &Notification) -> Answer {
    let timeout = Duration::from_secs(receiver.timeout_s.into());
    match &receiver.kind {
        ReceiverKind::Webhook { url: endpoint, secret_env } => {
            let target = match url(endpoint) {
                Ok(u) => u,
                Err(e) => return Answer::Later(e),
            };
            let body = match serde_json::to_vec(n) {
                Ok(b) => b,
                Err(e) => return Answer::Refused(format!("the notification does not serialise: {e}")),
            };
            let timestamp = chrono::Utc::now().timestamp();
            let mut request = client
                .post(&target)
                .timeout(timeout)
                .header("content-type", "application/json")
                .header(DELIVERY_HEADER, &n.id)
                .header(TIMESTAMP_HEADER, timestamp.to_string());
            if let Some(var) = secret_env {
                let Some(secret) = std::env::var(var).ok().filter(|s| !s.is_empty()) else {
                    // Never sent unsigned to a receiver that expects a signature.
                    return Answer::Later(format!(
                        "the variable {var} (secret_env) is not set in the environment of tidegate"
                    ));
                };
                request = request.header(SIGNATURE_HEADER, signature(secret.as_bytes(), timestamp, &body));
            }
            post(request.body(body)).await
        }
        ReceiverKind::Slack { url: endpoint } => {
            let target = match url(endpoint) {
                Ok(u) => u,
                Err(e) => return Answer::Later(e),
            };
            let text = format!("*{}* {}", n.project, n.summary);
            let body = serde_json::json!({ "text": text }).to_string();
            post(client.post(&target).timeout(timeout).header("content-type", "application/json").body(body)).await
        }
        ReceiverKind::Email { smtp, tls, from, to, login_env } => {
            let (smtp, tls, from, to, login_env) = (smtp.clone(), *tls, from.clone(), to.clone(), login_env.clone());
            let n = n.clone();
            let sent =
                tokio::task::spawn_blocking(move || mail(&smtp, tls, &from, &to, login_env.as_ref(), &n, timeout))
                    .await;
            sent.unwrap_or_else(|e| Answer::Later(format!("the mail task ended: {e}")))
        }
    }
}

async fn post(request: reqwest::RequestBuilder) -> Answer {
    match request.send().await {
        Ok(response) if response.status().is_success() => Answer::Delivered,
        Ok(response) => {
            let status = response.status();
            let why = format!("answered {status}");
            if status.is_client_error() && status.as_u16() != 408 && status.as_u16() != 429 {
                Answer::Refused(why)
            } else {
                Answer::Later(why)
            }
        }
        // Without the URL: it may hold a secret (Slack's do).
        Err(e) => Answer::Later(format!("unreachable: {}", e.without_url())),
    }
}

/// Sends `n` as a plain-text mail.
fn mail(
    smtp: &str,
    tls: SmtpTls,
    from: &str,
    to: &[String],
    login_env: Option<&(String, String)>,
    n: &Notification,
    timeout: Duration,
) -> Answer {
    use lettre::message::header::ContentType;
    use lettre::transport::smtp::authentication::Credentials;
    use lettre::{Message, SmtpTransport, Transport};

    let Some((host, port)) = smtp.rsplit_once(':').and_then(|(h, p)| Some((h, p.parse::<u16>().ok()?))) else {
        return Answer::Refused(format!("smtp {smtp:?} is not host:port"));
    };
    let mut message = Message::builder();
    match from.parse() {
        Ok(mailbox) => message = message.from(mailbox),
        Err(e) => return Answer::Refused(format!("from {from:?}: {e}")),
    }
    for address in to {
        match address.parse() {
            Ok(mailbox) => message = message.to(mailbox),
            Err(e) => return Answer::Refused(format!("to {address:?}: {e}")),
        }
    }
    let details = serde_json::to_string_pretty(&n.details).unwrap_or_default();
    let body = format!(
        "{}\n\nproject: {}\nevent: {}\nat: {}\njournal entry: {}\nid: {}\n\n{details}\n",
        n.summary, n.project, n.event, n.at, n.journal_seq, n.id
    );
    let message = match message
        .subject(format!("[tidegate {}] {}", n.project, n.summary))
        .header(ContentType::TEXT_PLAIN)
        .message_id(Some(format!("<{}@tidegate>", n.id)))
        .body(body)
    {
        Ok(m) => m,
        Err(e) => return Answer::Refused(format!("building the mail: {e}")),
    };
    let builder = match tls {
        SmtpTls::None => Ok(SmtpTransport::builder_dangerous(host)),
        SmtpTls::Starttls => SmtpTransport::starttls_relay(host),
        SmtpTls::Tls => SmtpTransport::relay(host),
    };
    let mut builder = match builder {
        Ok(b) => b.port(port).timeout(Some(timeout)),
        Err(e) => return Answer::Later(format!("connecting to {smtp}: {e}")),
    };
    if let Some((user_var, password_var)) = login_env {
        match (std::env::var(user_var), std::env::var(password_var)) {
            (Ok(user), Ok(password)) => builder = builder.credentials(Credentials::new(user, password)),
            _ => return Answer::Later(format!("the variables {user_var} and {password_var} are not both set")),
        }
    }
    match builder.build().send(&message) {
        Ok(_) => Answer::Delivered,
        Err(e) if e.is_permanent() => Answer::Refused(format!("{smtp} refused the mail: {e}")),
        Err(e) => Answer::Later(format!("{smtp}: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The value Python's `hmac.new(b"Jefe", b"0.what do ya want for nothing?", "sha256")` gives.
    #[test]
    fn the_signature_is_hmac_sha256_of_the_timestamp_and_the_body() {
        let sig = signature(b"Jefe", 0, b"what do ya want for nothing?");
        assert_eq!(sig, "sha256=37f471929915ccd2cbbe79feb84ffcff4f2bb25e15fc41c2506687331ae179cc");
        assert_ne!(sig, signature(b"Jefe", 1, b"what do ya want for nothing?"), "the timestamp is covered");
        assert_ne!(sig, signature(b"Jeff", 0, b"what do ya want for nothing?"), "the key is used");
    }
}
