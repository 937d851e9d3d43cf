//! The web UI over real HTTP, as a browser without scripts uses it: a login with a token's
//! secret, then pages read with the session's cookie.

use reqwest::{Client, StatusCode};

/// Logs in to the web UI served at `base` with `secret`: the session cookie to send with its
/// pages (`name=value`).
pub(crate) async fn session(base: &str, secret: &str) -> String {
    let client = Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    // The login form's own token, which the form posts back: any value the cookie holds too.
    let answer = client
        .post(format!("{base}/ui/login"))
        .header("cookie", "waymark_login=form-1")
        .form(&[("secret", secret), ("csrf", "form-1")])
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), StatusCode::SEE_OTHER);
    let cookies = answer.headers().get_all("set-cookie").iter();
    let session = cookies
        .filter_map(|cookie| cookie.to_str().ok())
        .find(|cookie| cookie.starts_with("waymark_session="))
        .expect("a session cookie");
    session.split(';').next().unwrap().to_owned()
}

/// The page at `path`, as the holder of `session` sees it.
pub(crate) async fn page(base: &str, session: &str, path: &str) -> String {
    let answer = Client::new()
        .get(format!("{base}{path}"))
        .header("cookie", session)
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), StatusCode::OK, "{path}");
    answer.text().await.unwrap()
}
