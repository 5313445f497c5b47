//go:build !race

package router

// raceDetector: the tests run under the race detector.
const raceDetector = false
