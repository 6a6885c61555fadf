package httplimit

// ForgetOutageLog makes the next store outage logged, whenever the last
// one was.
func ForgetOutageLog() { lastOutageLog.at.Store(0); lastWhoOutageLog.at.Store(0) }
