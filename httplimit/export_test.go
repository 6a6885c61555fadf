package httplimit

// ForgetOutageLog makes the next store outage logged, whenever the last
// one was.
func ForgetOutageLog() { lastOutageLog.Store(0) }
