// Acquire from a token bucket until denied, wait retry_after_ms, acquire again, clean up.
// Java 17+, java.net.http only, no build tool:
//   RATELIMITER_URL=http://127.0.0.1:8080 java examples/JavaClient.java
import java.io.IOException;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.util.concurrent.ThreadLocalRandom;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

public class JavaClient {
    static final String BASE =
        System.getenv().getOrDefault("RATELIMITER_URL", "http://127.0.0.1:8080").replaceAll("/$", "");
    // HTTP/1.1: the default would offer an h2c upgrade on every plain-http request.
    static final HttpClient HTTP = HttpClient.newBuilder().version(HttpClient.Version.HTTP_1_1).build();
    static final String POLICY =
        "example-java-" + ProcessHandle.current().pid() + "-" + ThreadLocalRandom.current().nextInt(1_000_000);

    static void fail(String message) {
        System.err.println("JavaClient.java: FAIL: " + message);
        System.exit(1);
    }

    static HttpResponse<String> call(String method, String path, String json) {
        HttpRequest.BodyPublisher body = json == null
            ? HttpRequest.BodyPublishers.noBody() : HttpRequest.BodyPublishers.ofString(json);
        HttpRequest request = HttpRequest.newBuilder(URI.create(BASE + path))
            .header("Content-Type", "application/json")
            .method(method, body)
            .build();
        try {
            return HTTP.send(request, HttpResponse.BodyHandlers.ofString());
        } catch (IOException | InterruptedException e) {
            fail("no answer from " + BASE + path + ": " + e);
            return null;
        }
    }

    // Minimal JSON reading: the value of a top-level number or boolean field.
    static String field(String json, String name) {
        Matcher m = Pattern.compile("\"" + name + "\"\\s*:\\s*(true|false|-?\\d+)").matcher(json);
        if (!m.find()) fail("no `" + name + "` in " + json);
        return m.group(1);
    }

    static String header(HttpResponse<String> response, String name) {
        return response.headers().firstValue(name).orElse(null);
    }

    static HttpResponse<String> acquire() {
        HttpResponse<String> r = call("POST", "/v1/acquire",
            "{\"policy\":\"" + POLICY + "\",\"key\":\"user-42\",\"cost\":1}");
        if (r.statusCode() != 200) fail("acquire: expected 200, got " + r.statusCode() + ": " + r.body());
        for (String name : new String[] {"RateLimit", "RateLimit-Policy"}) {
            if (header(r, name) == null) fail("acquire: no " + name + " header");
        }
        return r;
    }

    public static void main(String[] args) throws InterruptedException {
        // 3 tokens, refilled at 1 per second: the fourth request waits about 1 s.
        HttpResponse<String> r = call("POST", "/v1/policies", "{\"name\":\"" + POLICY + "\","
            + "\"algorithm\":\"token_bucket\",\"capacity\":3,\"refill_tokens\":1,\"refill_period_ms\":1000}");
        if (r.statusCode() != 201) fail("create policy: expected 201, got " + r.statusCode() + ": " + r.body());
        System.out.println("created policy " + POLICY + " (token bucket, 3 tokens, 1/s)");

        int expected = 2;
        int attempt = 0;
        while (true) {
            if (++attempt > 5) fail("never denied after 5 acquires");
            r = acquire();
            if (field(r.body(), "allowed").equals("false")) break;
            int remaining = Integer.parseInt(field(r.body(), "remaining"));
            if (remaining != expected) fail("acquire " + attempt + ": remaining " + remaining + ", expected " + expected);
            System.out.println("acquire " + attempt + ": allowed, remaining=" + remaining
                + ", RateLimit: " + header(r, "RateLimit"));
            expected--;
        }
        if (expected != -1) fail("denied after " + (attempt - 1) + " grants, expected 3");
        String retryAfter = header(r, "Retry-After");
        long waitMs = Long.parseLong(field(r.body(), "retry_after_ms"));
        if (retryAfter == null || waitMs <= 0) fail("denial without a wait: Retry-After=" + retryAfter + ", body=" + r.body());
        System.out.println("acquire " + attempt + ": denied, retry_after_ms=" + waitMs + ", Retry-After: " + retryAfter);

        Thread.sleep(waitMs);
        r = acquire();
        if (!field(r.body(), "allowed").equals("true")) fail("still denied after waiting " + waitMs + " ms: " + r.body());
        System.out.println("after sleeping " + waitMs + " ms: allowed, remaining=" + field(r.body(), "remaining"));

        r = call("DELETE", "/v1/policies/" + POLICY, null);
        if (r.statusCode() != 204) fail("delete policy: expected 204, got " + r.statusCode() + ": " + r.body());
        System.out.println("deleted policy " + POLICY);
        System.out.println("JavaClient.java: OK");
    }
}
