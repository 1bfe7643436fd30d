import './styles.css';

import { render } from 'preact';

import { Root } from './root';

render(<Root />, document.getElementById('app')!);
