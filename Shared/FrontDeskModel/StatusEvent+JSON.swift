import Foundation

// Hand-written encoders for the two bodies the router writes per request.
// Keys are added in sorted order so the bytes equal JSONEncoder's with
// `.sortedKeys` (checked by JSONWriterTests).

extension StatusEvent.Project {
    public func write(_ key: String, to json: inout JSONWriter) {
        json.beginObject(key)
        json.field("accent", accent)
        json.field("glyph", glyph)
        json.field("id", id)
        json.field("name", name)
        json.endObject()
    }
}

extension StatusEvent.Target {
    public func write(_ key: String, to json: inout JSONWriter) {
        json.beginObject(key)
        json.field("id", id)
        json.field("name", name)
        json.endObject()
    }
}

extension StatusEvent.Route {
    public func write(_ key: String, to json: inout JSONWriter) {
        json.beginObject(key)
        json.beginArray("alternatives")
        for alternative in alternatives {
            json.beginObject()
            json.field("confidence", alternative.confidence)
            json.field("project", alternative.project)
            json.field("target", alternative.target)
            json.endObject()
        }
        json.endArray()
        json.field("confidence", confidence)
        json.field("reason", reason)
        json.endObject()
    }
}

extension StatusEvent.ErrorInfo {
    public func write(_ key: String, to json: inout JSONWriter) {
        json.beginObject(key)
        json.field("code", code)
        json.field("message", message)
        json.endObject()
    }
}

extension StatusEvent {
    /// The event's body: sorted keys, so a re-sent event is byte-identical.
    public func jsonData() -> Data {
        JSONWriter.object { json in
            json.field("activity", activity)
            json.field("at", at)
            json.field("attempt", attempt)
            if let cancel {
                json.beginObject("cancel")
                json.field("reason", cancel.reason)
                json.endObject()
            }
            json.field("dispatchId", dispatchId)
            json.field("elapsedMs", elapsedMs)
            error?.write("error", to: &json)
            json.field("etaMs", etaMs)
            json.field("expiresAt", expiresAt)
            json.field("input", input)
            json.field("preview", preview)
            project?.write("project", to: &json)
            if let queue {
                json.beginObject("queue")
                json.field("reason", queue.reason)
                json.field("retryAt", queue.retryAt)
                json.endObject()
            }
            json.field("reply", reply)
            route?.write("route", to: &json)
            json.field("seq", seq)
            json.field("startedAt", startedAt)
            json.field("state", state.rawValue)
            json.field("step", step)
            json.field("steps", steps)
            target?.write("target", to: &json)
            json.field("threadId", threadId)
            json.field("user", user)
        }
    }
}

extension DispatchRecord {
    /// The decision record and hand-off body: sorted keys, stable bytes.
    public func jsonData() -> Data {
        JSONWriter.object { json in
            writeFields(to: &json)
        }
    }

    func writeFields(to json: inout JSONWriter) {
        json.field("bodyFingerprint", bodyFingerprint)
        json.field("decidedAt", decidedAt)
        error?.write("error", to: &json)
        json.field("expiresAt", expiresAt)
        json.field("id", id)
        json.field("input", input)
        json.field("invalid", invalid)
        json.field("lastSeq", lastSeq)
        json.field("outcome", outcome.rawValue)
        project?.write("project", to: &json)
        route?.write("route", to: &json)
        json.field("startedAt", startedAt)
        target?.write("target", to: &json)
        json.field("threadId", threadId)
        json.field("user", user)
    }
}

extension AgentTask {
    /// The task body of the agent protocol: sorted keys, stable bytes.
    public func jsonData() -> Data {
        JSONWriter.object { json in
            json.field("attempt", attempt)
            json.field("deadline", deadline)
            json.field("dispatchId", dispatchId)
            json.field("input", input)
            project.write("project", to: &json)
            target.write("target", to: &json)
            json.field("threadId", threadId)
            json.field("user", user)
        }
    }
}

extension ParkedDispatch {
    /// The body of a parked or delayed dispatch: sorted keys, stable bytes.
    public func jsonData() -> Data {
        JSONWriter.object { json in
            json.field("attempt", attempt)
            json.field("everDelivered", everDelivered)
            json.field("lastSeq", lastSeq)
            project.write("project", to: &json)
            json.beginObject("record")
            record.writeFields(to: &json)
            json.endObject()
            json.field("retryAt", retryAt)
            json.field("stepReached", stepReached)
            target.write("target", to: &json)
        }
    }
}
